"""compare_steps: finds the first diverging step and never raises on mismatched traces."""

from collections import OrderedDict

import numpy as np
import pytest
import torch

from parity_tests.compare import compare_steps
from parity_tests.tolerances import TOLERANCES, tolerance_for


def trace(dtype="float32", **changes):
    rng = np.random.default_rng(0)
    steps = OrderedDict(
        queries=rng.standard_normal((2, 3)).astype(dtype),
        attn_weights=rng.random((3, 3)).astype(dtype),
        output=rng.standard_normal((2, 3)).astype(dtype),
    )
    steps.update(changes)
    return steps


def test_identical_traces_match():
    report = compare_steps(trace(), trace())
    assert report.ok and report.first_divergence is None
    assert [row.step for row in report.rows] == ["queries", "attn_weights", "output"]
    assert all(row.max_abs_err == 0 and row.rtol == TOLERANCES["float32"][0] for row in report.rows)
    assert str(report).endswith("all steps match")


def test_first_divergence_is_named():
    expected = trace()
    actual = trace(attn_weights=expected["attn_weights"] + 1e-3, output=expected["output"] * 2)
    report = compare_steps(expected, actual)
    assert not report.ok
    assert report.first_divergence == "attn_weights"
    assert [row.ok for row in report.rows] == [True, False, False]
    assert report.rows[1].max_abs_err == pytest.approx(1e-3, rel=1e-3)
    assert "attn_weights" in str(report) and "<- first divergence" in str(report)


def test_differences_within_the_dtype_tolerance_pass():
    expected = trace("float64")
    rtol, atol = TOLERANCES["float64"]
    scale = max(np.abs(v).max() for v in expected.values())
    actual = trace("float64", output=expected["output"] + 0.5 * rtol * scale)
    assert compare_steps(expected, actual).ok
    actual = trace("float64", output=expected["output"] + 10 * (atol + rtol * scale))
    assert compare_steps(expected, actual).first_divergence == "output"


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_the_bound_is_atol_plus_rtol_times_the_largest_expected_value(dtype):
    """A deviation of 0.9 times ``atol + rtol * max|expected|`` passes, 1.1 times fails: the
    tolerance table's bound, neither looser nor tighter."""
    expected = trace(dtype)
    rtol, atol = TOLERANCES[dtype]
    bound = atol + rtol * float(np.abs(expected["output"]).max())
    for factor, ok in ((0.9, True), (1.1, False)):
        output = expected["output"].astype(np.float64)
        output[0, 0] += factor * bound  # one entry off, the others equal
        report = compare_steps(expected, trace(dtype, output=output.astype(dtype)))
        assert report.ok is ok, (factor, report.rows[-1].max_abs_err, bound)


def test_shape_and_name_mismatches_are_reported_not_raised():
    expected = trace()
    actual = OrderedDict(queries=expected["queries"].T, extra=expected["output"])
    report = compare_steps(expected, actual)
    notes = {row.step: row.note for row in report.rows}
    assert notes == {
        "queries": "shape mismatch",
        "attn_weights": "missing in actual",
        "output": "missing in actual",
        "extra": "missing in expected",
    }
    assert report.first_divergence == "queries"


def test_nan_must_sit_at_the_same_places():
    expected = trace(output=np.array([[np.nan, 1.0], [2.0, -np.inf]]))
    assert compare_steps(expected, trace(output=expected["output"].copy())).ok
    moved = trace(output=np.array([[0.0, np.nan], [2.0, -np.inf]]))
    report = compare_steps(expected, moved)
    assert report.first_divergence == "output" and "NaN/inf" in report.rows[-1].note


def test_tolerance_comes_from_the_least_precise_dtype():
    assert tolerance_for("float64", "float32") == TOLERANCES["float32"]
    assert tolerance_for("float32", "bfloat16") == TOLERANCES["bfloat16"]
    assert tolerance_for("bool") == (0.0, 0.0)


def test_torch_tensors_and_bfloat16_are_accepted():
    expected = OrderedDict(output=torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    actual = OrderedDict(output=np.array([1.0, 2.0], dtype=np.float32))
    report = compare_steps(expected, actual)
    assert report.ok and report.rows[0].rtol == TOLERANCES["bfloat16"][0]
