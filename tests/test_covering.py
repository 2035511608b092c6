"""tests/covering.py: the default run's pairwise subsets cover every pair of values."""

import itertools

import pytest

from tests.covering import each_value, each_value_params, pairwise

AXES = {
    "two_axes": {"a": [1, 2, 3], "b": ["x", "y"]},
    "parity_table": {"layer": range(8), "shape": range(5), "bias": [False, True], "dtype": range(3)},
    "with_runner": {"layer": range(8), "shape": range(5), "bias": [0, 1], "dtype": range(3), "run": range(3)},
    "equal_sizes": {name: range(3) for name in "abcd"},
    "many_binary": {name: [False, True] for name in "abcdef"},  # needs rows beyond a x b
}


@pytest.mark.parametrize("name", AXES)
def test_every_pair_of_values_meets(name):
    axes = AXES[name]
    rows = pairwise(axes)
    for first, second in itertools.combinations(axes, 2):
        expected = set(itertools.product(axes[first], axes[second]))
        actual = {(row[first], row[second]) for row in rows}
        assert actual == expected, (first, second)
    assert all(sorted(row) == sorted(axes) for row in rows)
    assert len(rows) < len(list(itertools.product(*axes.values()))) or len(axes) == 2


def test_two_axes_give_their_product_and_the_rows_never_change():
    assert pairwise({"a": [1, 2, 3], "b": ["x", "y"]}) == [
        {"a": a, "b": b} for a, b in itertools.product([1, 2, 3], ["x", "y"])
    ]
    axes = AXES["with_runner"]
    assert pairwise(axes) == pairwise(axes)
    assert len(pairwise(axes)) == 40  # layer x shape, the least any covering set needs


def test_each_value_puts_every_value_of_every_axis_in_a_row():
    axes = {"layer": list("abcdefgh"), "dtype": ["f32", "f64", "bf16"], "pair": list(range(6))}
    rows = each_value(axes)
    assert len(rows) == 8
    for name, values in axes.items():
        assert {row[name] for row in rows} == set(values)
    assert rows[3] == {"layer": "d", "dtype": "f32", "pair": 3}


def test_each_value_params_marks_the_rest_of_the_product_slow():
    axes = {"layer": list("abc"), "dtype": ["f32", "f64"]}
    params = each_value_params(axes)
    marked = [run for run in params if hasattr(run, "marks")]  # pytest.param(..., marks=slow)
    fast = [run for run in params if not hasattr(run, "marks")]
    assert fast == [("a", "f32"), ("b", "f64"), ("c", "f32")]
    assert sorted(fast + [run.values for run in marked]) == sorted(itertools.product(*axes.values()))
    assert [mark.name for run in marked for mark in run.marks] == ["slow"] * 3
