"""Property-based parity: random shapes, heads, bias flags and dtypes, numpy and JAX vs torch.

``make test`` runs a fast, derandomized profile (FAST_EXAMPLES per class); ``make test-slow``
runs the slow profile (SLOW_EXAMPLES per class, marker ``slow``).
"""

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context, run_case, run_jax, run_torch
from torch_ref import to_params

FAST_EXAMPLES = 6
SLOW_EXAMPLES = 500
LAYERS = list(FUNCTION_NAMES)


@st.composite
def cases(draw, layer: str) -> Case:
    num_heads = draw(st.integers(1, 4))
    head_dim = draw(st.integers(1, 4))
    d_out = num_heads * head_dim
    if layer == "FusedSingleHeadAttention":
        d_out = draw(st.integers(4, 16))  # head size hidden_size // 4 >= 1
    tokens = draw(st.integers(1, 9))
    return Case(
        layer,
        batch=draw(st.integers(1, 3)),
        tokens=tokens,
        d_in=draw(st.integers(1, 9)),
        d_out=d_out,
        num_heads=num_heads,
        bias=draw(st.booleans()),
        out_bias=draw(st.booleans()),
        context_length=tokens + draw(st.integers(0, 3)),
        dtype=draw(st.sampled_from(["float32", "float64"])),
        seed=draw(st.integers(0, 2**16)),
    )


def check_parity(case: Case) -> None:
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = run_torch(module, x)[1]
    numpy_report = compare_steps(expected, run_case("numpy", case, params, x)[1])
    with jax_context(case.dtype):
        jax_report = compare_steps(expected, run_jax(case, params, x)[1])
    assert numpy_report.ok, f"{case}\n{numpy_report}"
    assert jax_report.ok, f"{case}\n{jax_report}"


COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "database": None}


@pytest.mark.parametrize("layer", LAYERS)
def test_random_cases_match_torch(layer):
    @settings(max_examples=FAST_EXAMPLES, derandomize=True, **COMMON)
    @given(cases(layer))
    def check(case):
        check_parity(case)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("layer", LAYERS)
def test_random_cases_match_torch_slow_profile(layer):
    @settings(max_examples=SLOW_EXAMPLES, **COMMON)
    @given(cases(layer))
    def check(case):
        check_parity(case)
        # Every new shape compiles a program; thousands of them would exhaust the process's
        # memory mappings (vm.max_map_count: a segfault inside XLA was seen here), so free them.
        jax.clear_caches()

    check()
