"""``transforms.due_value``: the value due laid out as the candidate's, or its first slice, on values
worked out by hand."""

import numpy as np

from parity_tests.locate.transforms import due_value


def test_the_first_sequence_of_rows_merged_over_the_batch():
    """A ``(B*T, D)`` reference value (GPT-2's ``Conv1D`` input) against a port's one sequence
    ``(T, D)``: the rows of the first sequence, the split read from the run's reshapes."""
    value = np.arange(2 * 3 * 4).reshape(6, 4)  # (B*T, D), B = 2, T = 3
    expected = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(due_value(value, (3, 4), {6: (2, 3)}), expected)


def test_the_first_head_of_the_first_sequence():
    value = np.arange(2 * 3 * 4 * 4).reshape(2, 3, 4, 4)  # (B, N, T, S)
    np.testing.assert_array_equal(due_value(value, (4, 4), {}), value[0, 0])


def test_a_value_of_the_same_layout_as_it_is_and_none_where_nothing_fits():
    value = np.arange(12.0).reshape(3, 4)
    assert due_value(value, (3, 4), {}) is value
    assert due_value(value, (5,), {}) is None  # 12 is no multiple of 5
    assert due_value(np.zeros(0), (2, 3), {}) is None
