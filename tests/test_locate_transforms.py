"""``transforms.due_value``: the value due laid out as the candidate's, or its first slice; and the
checks the causes rest on (a scale, a norm): on values worked out by hand."""

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


# --- the causes' checks, on values worked out by hand ---------------------------------------------


def test_scale_between_reads_one_factor_over_the_entries_both_keep():
    """A factor where yours is the reference's times it with the same entries hidden (a -inf and a
    finfo.min fill alike); none where the hidden entries differ (a mask transposed: the diagonal both
    keep is no evidence of a scale), and none for 0."""
    from parity_tests.locate.causes import scale_between

    scores = np.array([[1.0, -np.inf], [2.0, -4.0]])
    assert scale_between(scores, 0.5 * scores, 1e-6, 1e-9) == 0.5
    finite_fill = np.where(np.isinf(scores), np.finfo(np.float32).min, 0.5 * scores)
    assert scale_between(scores, finite_fill, 1e-6, 1e-9) == 0.5
    transposed = np.array([[0.5, 1.0], [-np.inf, -2.0]])  # the diagonal alone halved
    assert scale_between(scores, transposed, 1e-6, 1e-9) is None
    unmasked = np.array([[0.5, 7.0], [1.0, -2.0]])  # halved where both keep, but 7 where -inf is due
    assert scale_between(scores, unmasked, 1e-6, 1e-9) is None
    assert scale_between(scores, 0.5 * scores + [[0, 0], [0, 1]], 1e-6, 1e-9) is None  # no one factor
    assert scale_between(scores, np.where(np.isinf(scores), scores, 0.0), 1e-6, 1e-9) is None


def test_which_norm_tells_a_layer_norm_and_an_rms_norm_of_a_value():
    from parity_tests.locate.causes import which_norm

    x = np.random.default_rng(0).standard_normal((6, 5))
    weight, bias = np.linspace(0.5, 1.5, 5), np.linspace(-0.2, 0.2, 5)
    centred = x - x.mean(-1, keepdims=True)
    layer_norm = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * weight + bias
    rms_norm = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * weight
    assert which_norm(layer_norm, x, 1e-6, 1e-9) == "a layer norm"
    assert which_norm(rms_norm, x, 1e-6, 1e-9) == "an RMS norm"
    assert which_norm(2 * x + 1, x, 1e-6, 1e-9) is None  # an affine map is no norm
    assert which_norm(layer_norm[:2], x[:2], 1e-6, 1e-9) is None  # two rows: any weight and bias fit
    assert which_norm(np.zeros_like(x) + bias, x, 1e-6, 1e-9) is None  # features the same in every row
