"""KV-cache decoding: prefill, then token by token, equals the full causal pass."""

import functools
import re

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
    with pytest.raises(ValueError, match=r"^cache holds 12 of 12 tokens; 1 more do not fit$"):
        package.multi_head_attention_decode(params, x[:, :1], cache, num_heads=2, context_length=12)


@pytest.mark.parametrize("framework", ["numpy", "jax"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_a_cache_longer_than_the_context_refuses_tokens_past_it(layer, framework):
    """A cache of 20 tokens for a layer whose context is 12 held 10 and took 3 more: 13 tokens,
    which the full causal pass refuses. Now the context-length error, counting the cache's."""
    case = decode_case(layer, "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    package, name = PACKAGES[framework], "context_length" if layer == "MultiHeadAttention" else "context_size"
    decode_fn = getattr(package, LAYERS[layer])
    cache = package.init_kv_cache(2, 2, 20, 4)
    _, cache = decode_fn(params, x[:, :10], cache, num_heads=2, **{name: 12})
    message = f"x has 3 tokens (shape {x[:, :3].shape}) after the cache's 10, 13 in all, but {name} is 12"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        decode_fn(params, x[:, :3], cache, num_heads=2, **{name: 12})
    _, cache = decode_fn(params, x[:, 10:12], cache, num_heads=2, **{name: 12})  # up to the context: fine
    assert int(cache.length) == 12


BAD_SIZES = [
    ((2, 2, 6.0, 2), TypeError, "max_length must be a positive int, got 6.0 (float)"),
    ((2, 2, 0, 2), ValueError, "max_length must be a positive int, got 0"),
    ((2, 2, True, 2), TypeError, "max_length must be a positive int, got True (bool)"),
    ((2, 2, None, 2), TypeError, "max_length must be a positive int, got None (NoneType)"),
    ((0, 2, 6, 2), ValueError, "batch must be a positive int, got 0"),
    ((2, 2.0, 6, 2), TypeError, "num_heads must be a positive int, got 2.0 (float)"),
    ((2, 2, 6, True), TypeError, "head_dim must be a positive int, got True (bool)"),
    ((2, 2, 6, 2.0), TypeError, "head_dim must be a positive int, got 2.0 (float)"),
]


@pytest.mark.parametrize("sizes, error, message", BAD_SIZES, ids=[repr(s) for s, _, _ in BAD_SIZES])
@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_init_kv_cache_checks_every_size(framework, sizes, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        PACKAGES[framework].init_kv_cache(*sizes)


@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_init_kv_cache_accepts_numpy_ints(framework):
    cache = PACKAGES[framework].init_kv_cache(np.int64(2), np.int32(2), np.int64(6), np.uint8(2))
    assert cache.keys.shape == cache.values.shape == (2, 2, 6, 2) and cache.padding.shape == (2, 6)


@pytest.mark.parametrize("cache_dtype", ["float16", "float64"])
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_a_cache_of_another_dtype_than_x_is_refused(framework, layer, cache_dtype):
    """Not keys and values rounded to the cache's dtype in silence: the dtype-mismatch TypeError."""
    case = decode_case(layer, "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    package = PACKAGES[framework]
    name = "context_length" if layer == "MultiHeadAttention" else "context_size"
    with jax_context(cache_dtype):
        cache = package.init_kv_cache(2, 2, 12, 4, getattr(np, cache_dtype))
        message = f"cache has dtype {cache_dtype} but x has dtype float32"
        with pytest.raises(TypeError, match=f"^{message}$"):
            getattr(package, LAYERS[layer])(params, x, cache, num_heads=2, **{name: 12})


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("framework, other", [("numpy", "jax"), ("jax", "numpy")])
def test_a_cache_of_the_other_package_is_refused(framework, other, layer):
    """Not 'int' object has no attribute 'dtype' (jax) or JAX's "arrays are immutable" (numpy)."""
    case = decode_case(layer, "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    name = "context_length" if layer == "MultiHeadAttention" else "context_size"
    cache = PACKAGES[other].init_kv_cache(2, 2, 12, 4)
    message = (
        f"cache must be the KVCache of {PACKAGES[framework].__name__}.init_kv_cache(...), "
        f"got {PACKAGES[other].__name__}.kv_cache.KVCache"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        getattr(PACKAGES[framework], LAYERS[layer])(params, x, cache, num_heads=2, **{name: 12})
    message = message.replace(f"{PACKAGES[other].__name__}.kv_cache.KVCache", "builtins.tuple")
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):  # a plain tuple neither
        getattr(PACKAGES[framework], LAYERS[layer])(params, x, (1, 2, 3, 4), num_heads=2, **{name: 12})


BAD_CACHES = [
    ((3, 2, 12, 4), "cache.keys has shape (3, 2, 12, 4), but x of shape (2, 12, 6) with num_heads=2 "
     "needs (B, N, L, H) = (2, 2, L, 4)"),
    ((2, 1, 12, 4), "cache.keys has shape (2, 1, 12, 4), but x of shape (2, 12, 6) with num_heads=2 "
     "needs (B, N, L, H) = (2, 2, L, 4)"),
    ((2, 2, 12, 2), "cache.keys has shape (2, 2, 12, 2), but x of shape (2, 12, 6) with num_heads=2 "
     "needs (B, N, L, H) = (2, 2, L, 4)"),
]  # fmt: skip


@pytest.mark.parametrize("sizes, message", BAD_CACHES, ids=[repr(s) for s, _ in BAD_CACHES])
@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_a_cache_of_other_sizes_than_x_is_refused(framework, sizes, message):
    """The same ValueError in both packages, naming the shapes (not a broadcast error)."""
    case = decode_case("MultiHeadAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    package = PACKAGES[framework]
    cache = package.init_kv_cache(*sizes)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        package.multi_head_attention_decode(params, x, cache, num_heads=2, context_length=12)
    cache = package.init_kv_cache(2, 2, 12, 4)._replace(padding=cache.padding[:1])
    message = (
        "cache.padding has shape (1, 12) and cache.values (2, 2, 12, 4), "
        "but cache.keys (2, 2, 12, 4) needs (2, 12) and (2, 2, 12, 4)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        package.multi_head_attention_decode(params, x, cache, num_heads=2, context_length=12)


BAD_LENGTHS = [
    (2.0, TypeError, "cache.length must be an int or a 0-d integer array (the tokens "
     "cached so far), got 2.0 (float)"),
    (True, TypeError, "cache.length must be an int or a 0-d integer array (the tokens "
     "cached so far), got True (bool)"),
    (-1, ValueError, "cache.length is -1, outside [0, 12]: not a cache's length"),
    (13, ValueError, "cache.length is 13, outside [0, 12]: not a cache's length"),
]  # fmt: skip


@pytest.mark.parametrize(
    "length, error, message", BAD_LENGTHS, ids=["float", "bool", "negative", "past_the_end"]
)
@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_a_hand_built_cache_length_is_checked(framework, length, error, message):
    """Not jax's "'int' object has no attribute 'dtype'", nor numpy writing before the cache's
    start (a negative length) in silence: one error in both packages."""
    case = decode_case("MultiHeadAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    package = PACKAGES[framework]
    cache = package.init_kv_cache(2, 2, 12, 4)._replace(length=length)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        package.multi_head_attention_decode(params, x[:, :1], cache, num_heads=2, context_length=12)


@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_a_hand_built_cache_with_a_python_int_length_decodes_like_init_kv_cache(framework):
    case = decode_case("MultiHeadAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    package = PACKAGES[framework]
    cache = package.init_kv_cache(2, 2, 12, 4)
    expected, expected_cache = package.multi_head_attention_decode(
        params, x[:, :3], cache, num_heads=2, context_length=12
    )
    output, new_cache = package.multi_head_attention_decode(
        params, x[:, :3], cache._replace(length=0), num_heads=2, context_length=12
    )
    np.testing.assert_array_equal(np.asarray(output), np.asarray(expected))
    assert int(new_cache.length) == int(expected_cache.length) == 3


@pytest.mark.parametrize("framework, jit", [("numpy", False), ("jax", False), ("jax", True)])
def test_a_narrow_integer_cache_length_does_not_wrap(framework, jit):
    """A hand-built length np.uint8(255) plus one token was 0 (uint8 arithmetic) in both packages:
    the cache forgot its tokens in silence. Now the new length is 256, in init_kv_cache's type."""
    case = decode_case("MultiHeadAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    package = PACKAGES[framework]
    step = functools.partial(package.multi_head_attention_decode, num_heads=2, context_length=300)
    if jit:
        step = jax.jit(step)
    cache = package.init_kv_cache(2, 2, 300, 4)
    expected, expected_cache = step(params, x[:, :1], cache._replace(length=255))
    output, new_cache = step(params, x[:, :1], cache._replace(length=np.uint8(255)))
    np.testing.assert_array_equal(np.asarray(output), np.asarray(expected))
    assert int(new_cache.length) == int(expected_cache.length) == 256
    if framework == "numpy":
        assert type(new_cache.length) is int
    else:
        assert new_cache.length.dtype == np.int32


@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_a_cache_whose_padding_is_not_bool_is_refused(framework):
    case = decode_case("MultiHeadAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    package = PACKAGES[framework]
    cache = package.init_kv_cache(2, 2, 12, 4)
    cache = cache._replace(padding=cache.padding.astype(np.float32))
    with pytest.raises(TypeError, match=r"^cache.padding must be bool \(True = padding\), got float32$"):
        package.multi_head_attention_decode(params, x[:, :1], cache, num_heads=2, context_length=12)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("field", ["keys", "values"])
def test_a_big_endian_cache_gets_the_byte_order_error(layer, field):
    """numpy_attn's cache holds NumPy arrays: a big-endian one is named with the byte order, not
    'cache has dtype float32 but x has dtype float32'. (jax_attn's holds JAX arrays: never.)"""
    case = decode_case(layer, "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    name = "context_length" if layer == "MultiHeadAttention" else "context_size"
    cache = numpy_attn.init_kv_cache(2, 2, 12, 4)
    cache = cache._replace(**{field: getattr(cache, field).astype(">f4")})
    message = (
        f"cache.{field} has dtype >f4, big-endian; give it in the machine's byte order: .astype(np.float32)"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        getattr(numpy_attn, LAYERS[layer])(params, x[:, :1], cache, num_heads=2, **{name: 12})


FLOATS = "float16, float32, float64; bfloat16 in jax_attn"


@pytest.mark.parametrize(
    "dtype, message",
    [
        (
            np.int32,
            "dtype must be a floating dtype (float16, float32, float64; bfloat16 in jax_attn), got int32",
        ),
        (None, "dtype must be a floating dtype (float16, float32, float64; bfloat16 in jax_attn), got None"),
        (np.dtype(">f4"), "dtype is >f4, big-endian; give it in the machine's byte order: np.float32"),
    ],
    ids=["int32", "None", "big_endian"],
)
@pytest.mark.parametrize("framework", ["numpy", "jax"])
def test_init_kv_cache_checks_its_dtype(framework, dtype, message):
    """The Flax constructors' dtype rule (check_dtype_argument), not a cache no decode accepts."""
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        PACKAGES[framework].init_kv_cache(2, 2, 6, 2, dtype)
