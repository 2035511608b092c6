"""KV-cache decoding: prefill, then token by token, equals the full causal pass."""

import jax
import numpy as np
import pytest

import jax_attn
import numpy_attn
from parity_tests.cases import Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context, run_case, run_torch
from torch_ref import to_params

PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}
LAYERS = {
    "MultiHeadAttention": "multi_head_attention_decode",
    "FusedCausalAttention": "fused_causal_attention_decode",
}


def decode_case(layer, dtype):
    return Case(layer, batch=2, tokens=12, d_in=6, d_out=8, num_heads=2, bias=True, dtype=dtype, seed=31)


def decode(package, case, params, x, prefill, padding_mask=None, jit=False):
    """Prefill ``prefill`` tokens, then decode the rest one at a time; return all outputs."""
    fn = getattr(package, LAYERS[case.layer])
    kwargs = {"num_heads": case.num_heads}
    kwargs["context_length" if case.layer == "MultiHeadAttention" else "context_size"] = case.tokens
    step = lambda p, x, cache, *pad: fn(p, x, cache, *pad, **kwargs)  # noqa: E731
    if jit:
        step = jax.jit(step)
    head_dim = case.d_out // case.num_heads
    cache = package.init_kv_cache(case.batch, case.num_heads, case.tokens, head_dim, x.dtype)
    pad = lambda t0, t1: () if padding_mask is None else (padding_mask[:, t0:t1],)  # noqa: E731
    outputs = []
    output, cache = step(params, x[:, :prefill], cache, *pad(0, prefill))
    outputs.append(np.asarray(output))
    for t in range(prefill, case.tokens):
        output, cache = step(params, x[:, t : t + 1], cache, *pad(t, t + 1))
        outputs.append(np.asarray(output))
    return np.concatenate(outputs, axis=1), step


@pytest.mark.parametrize("prefill", [1, 5, 12])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("framework", ["numpy", "jax"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_decoding_equals_the_full_causal_pass(layer, framework, dtype, prefill):
    case = decode_case(layer, dtype)
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = {"output": run_torch(module, x)[0]}
    with jax_context(dtype):
        outputs, _ = decode(PACKAGES[framework], case, params, x, prefill, jit=framework == "jax")
        report = compare_steps(expected, {"output": outputs})
    assert report.ok, f"\n{report}"


@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_decoding_with_padding(framework):
    case = decode_case("FusedCausalAttention", "float64")
    params, x = to_params(case.build_torch()), case.make_input()
    padding_mask = np.zeros((2, 12), bool)
    padding_mask[0, :2] = True  # left padding: the first two queries of sequence 0 see nothing
    padding_mask[1, 5] = True  # a padding token in the middle
    expected = run_case("numpy", case, params, x, padding_mask)[0]
    with jax_context("float64"):
        outputs, _ = decode(PACKAGES[framework], case, params, x, 4, padding_mask, jit=framework == "jax")
    np.testing.assert_allclose(outputs, expected, rtol=1e-12, atol=1e-12)


def test_jitted_decoding_compiles_once_per_input_length():
    case = decode_case("MultiHeadAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    _, step = decode(jax_attn, case, params, x, 4, jit=True)
    assert step._cache_size() == 2  # the 4-token prefill and the single-token steps


@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_a_full_cache_refuses_more_tokens(framework):
    case = decode_case("MultiHeadAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    package = PACKAGES[framework]
    cache = package.init_kv_cache(2, 2, 12, 4, np.float32)
    _, cache = package.multi_head_attention_decode(params, x, cache, num_heads=2, context_length=12)
    with pytest.raises(ValueError, match="the cache holds 12 of 12 tokens; 1 more do not fit"):
        package.multi_head_attention_decode(params, x[:, :1], cache, num_heads=2, context_length=12)
