"""Every step of every numpy_attn layer equals torch_ref on identical weights and inputs."""

import pytest

from parity_tests.cases import FUNCTION_NAMES, SHAPES, case_product
from parity_tests.compare import compare_steps
from parity_tests.frameworks import run_case, run_torch
from torch_ref import to_params

CASES = list(
    case_product(
        list(FUNCTION_NAMES), list(SHAPES), biases=[False, True], dtypes=["float32", "float64", "float16"]
    )
)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_every_step_matches_torch(case):
    module = case.build_torch()
    x = case.make_input()
    expected_output, expected = run_torch(module, x)
    actual_output, actual = run_case("numpy", case, to_params(module), x)

    report = compare_steps(expected, actual)
    assert report.ok, f"\n{report}"
    assert list(actual) == list(expected)  # same step names, same order
    assert actual_output.dtype == x.dtype  # float32 stays float32, float64 stays float64


@pytest.mark.parametrize("layer", ["MultiHeadAttention"])
@pytest.mark.parametrize("out_bias", [False, True], ids=["note004_out_bias_off", "book_out_bias_on"])
def test_out_proj_bias_follows_the_weights(layer, out_bias):
    case = next(case_product([layer], ["full_context"], [False], ["float64"])).with_(out_bias=out_bias)
    module = case.build_torch()
    params = to_params(module)
    assert ("out_proj.bias" in params) == out_bias
    x = case.make_input()
    report = compare_steps(run_torch(module, x)[1], run_case("numpy", case, params, x)[1])
    assert report.ok, f"\n{report}"
