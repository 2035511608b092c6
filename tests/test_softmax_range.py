"""Every softmax path subtracts the row maximum of exactly the values it exponentiates (issue 34):
no NaN or inf from finite inputs, in every dtype, eager and under ``jax.jit``, at magnitudes up
to the dtype's range, and the result torch's (float64, the tolerance table's bound).

The attention paths (numpy_attn's and jax_attn's reference ``scaled_dot_product_attention`` and
``blockwise_attention``, ``ring_attention``) get queries and keys of a few significant bits
times a power of two, with H = 4: every path computes the same scores, exactly, and divides
them by sqrt(H) = 2 exactly, so torch's float64 softmax of those scores is the answer to within
the rounding of exp and its sums, even where the scores reach the dtype's range. ``softmax``
gets any finite values up to the dtype's largest, alone and scaled by 1/sqrt(8) inside the
caller's ``jax.jit`` (the issue's reproducer: XLA fused the scaling into softmax twice). The
issue's layer reproducer: ``causal_attention`` on x ~ 1e6 (float32) and ~3e5 (bfloat16).
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType

import jax_attn
import numpy_attn
from jax_attn.parallel import ring_attention
from parity_tests.cases import Case
from parity_tests.compare import compare_arrays
from parity_tests.frameworks import jax_context
from parity_tests.tolerances import tolerance_for
from torch_ref import to_params

SHAPE = (2, 2, 8, 4)  # (B, N, T, H): H = 4, a scale of exactly 1/2
BLOCK_SIZE = 3  # blocks that do not divide T
EXAMPLES = 12
SETTINGS = settings(
    max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16}
NUMPY_DTYPES = ("float16", "float32", "float64")  # NumPy has no bfloat16 arithmetic


def exponents(low: int, high: int) -> st.SearchStrategy[int]:
    """An exponent from ``high`` down to ``low`` in 8 even steps (``st.integers`` would mostly draw
    small ones): the top of the range is as likely as any."""
    return st.sampled_from(sorted({int(e) for e in np.linspace(high, low, 8)}, reverse=True))


def largest_exponent(dtype: str) -> int:
    """The largest E for which the queries and keys (up to 3 * 2^E) fit the dtype and the scores
    (up to H * 9 * 2^2E, in float32 for half precision) fit the dtype the scores are computed in."""
    compute = np.float32 if dtype in ("float16", "bfloat16") else DTYPES[dtype]
    inputs = int(np.log2(float(ml_dtypes.finfo(DTYPES[dtype]).max) / 3))
    scores = int(np.log2(float(np.finfo(compute).max) / 36)) // 2
    return min(inputs, scores)


@st.composite
def attention_problems(draw, dtype: str):
    """Queries and keys: ints in [-3, 3] times 2^E (E up to the dtype's range, the two exponents
    drawn apart); values standard normal; a padding mask (True = padding) that may hide every key
    of a row."""
    top = largest_exponent(dtype)
    lowest = -8 if dtype in ("float16", "bfloat16") else -30
    scales = [draw(exponents(lowest, top)) for _ in range(2)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    queries, keys = (rng.integers(-3, 4, SHAPE) * 2.0**e for e in scales)
    values = rng.standard_normal(SHAPE)
    padding_mask = rng.random(SHAPE[:1] + SHAPE[2:3]) < draw(st.sampled_from([0.0, 0.3, 0.9]))
    return tuple(a.astype(DTYPES[dtype]) for a in (queries, keys, values)), padding_mask


def expected_attention(queries, keys, values, padding_mask):
    """torch's causal softmax attention in float64 (a row that sees no key: zeros, numpy_attn's rule)."""
    q, k, v = (torch.from_numpy(a.astype(np.float64)) for a in (queries, keys, values))
    num_tokens = q.shape[-2]
    hidden = torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool), 1)
    hidden = hidden | torch.from_numpy(padding_mask)[:, None, None, :]  # (B, 1, T, S)
    scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(hidden, -torch.inf)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return (weights @ v).numpy()


def mask_of(padding_mask):
    """The reference path's mask: causal, and the padding of each batch row (True = hidden)."""
    causal = numpy_attn.causal_mask(SHAPE[2])  # (T, S)
    return causal[None, None] if padding_mask is None else causal | padding_mask[:, None, None, :]


MESH = jax.make_mesh((1,), ("seq",), axis_types=(AxisType.Auto,))


def attention_paths(dtype: str) -> dict:
    """Every path, ``(queries, keys, values, padding_mask) -> context``: the reference path (the
    mask: causal, and each batch row's padding), the blockwise one, the ring (of one device)."""

    def reference(package):
        return lambda q, k, v, p: package.scaled_dot_product_attention(q, k, v, mask_of(p))

    def blockwise(package):
        return lambda q, k, v, p: package.blockwise_attention(
            q, k, v, causal=True, padding_mask=p, block_size=BLOCK_SIZE
        )

    def ring(q, k, v, p):
        return ring_attention(q, k, v, MESH, padding_mask=p)

    paths = {}
    for name, path in {
        "reference": reference(jax_attn),
        "blockwise": blockwise(jax_attn),
        "ring": ring,
    }.items():
        paths[f"jax {name}"], paths[f"jax jit {name}"] = path, jax.jit(path)
    if dtype in NUMPY_DTYPES:
        paths |= {"numpy reference": reference(numpy_attn), "numpy blockwise": blockwise(numpy_attn)}
    return paths


def assert_matches(name, expected, actual, dtype):
    actual = np.asarray(actual)
    assert actual.dtype == DTYPES[dtype], name
    assert np.isfinite(actual.astype(np.float64)).all(), f"{name}: NaN or inf from finite inputs"
    rtol, atol = tolerance_for(dtype)
    row = compare_arrays(name, expected, actual.astype(np.float64), rtol=rtol, atol=atol)
    assert row.ok, row


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_attention_paths_match_torch_at_every_magnitude(dtype):
    paths = attention_paths(dtype)

    @SETTINGS
    @given(attention_problems(dtype))
    def check(problem):
        arrays, padding_mask = problem
        expected = expected_attention(*arrays, padding_mask)
        for name, path in paths.items():
            inputs = arrays if name.startswith("numpy") else tuple(jnp.asarray(a) for a in arrays)
            assert_matches(name, expected, path(*inputs, padding_mask), dtype)

    with jax_context(dtype):
        check()


@st.composite
def inexact_problems(draw, dtype: str, head_dim: int):
    """Queries and keys of full precision (their products round) at magnitudes up to where the
    scores reach the dtype's range; values standard normal; a padding mask or none (then the
    blockwise path masks only its diagonal blocks)."""
    top = (largest_exponent(dtype) * 2 - int(np.log2(head_dim)) - 8) // 2
    scale = 2.0 ** draw(exponents(0, top))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (*SHAPE[:-1], head_dim)
    queries, keys = (rng.standard_normal(shape) * scale for _ in range(2))
    values = rng.standard_normal(shape)
    padding_mask = rng.random(SHAPE[:1] + SHAPE[2:3]) < 0.3 if draw(st.booleans()) else None
    return tuple(a.astype(DTYPES[dtype]) for a in (queries, keys, values)), padding_mask


@pytest.mark.parametrize("dtype, head_dim", [("float32", 1), ("float32", 8), ("bfloat16", 1)])
def test_attention_paths_average_the_visible_values_at_every_magnitude(dtype, head_dim):
    """Scores that round (a head of size 1 is one product; 1/sqrt(8) is inexact), up to the
    dtype's range: whatever the softmax's conditioning, each output is finite and an average of
    the values its query sees (zeros where it sees none)."""
    paths = attention_paths(dtype)

    @SETTINGS
    @given(inexact_problems(dtype, head_dim))
    def check(problem):
        (queries, keys, values), padding_mask = problem
        hidden = mask_of(padding_mask)[..., None]  # (B, 1, T, S, 1), True = hidden
        keys_values = values.astype(np.float64)[:, :, None]  # (B, N, 1, S, H)
        low = np.where(hidden, np.inf, keys_values).min(axis=-2)  # (B, N, T, H): over the visible keys
        high = np.where(hidden, -np.inf, keys_values).max(axis=-2)
        unseen = hidden.all(axis=-2)  # (B, 1, T, 1): rows that see no key give zeros
        rtol, atol = tolerance_for(dtype)
        slack = atol + rtol * np.abs(keys_values).max()
        for name, path in paths.items():
            arrays = (queries, keys, values)
            actual = path(*(arrays if name.startswith("numpy") else map(jnp.asarray, arrays)), padding_mask)
            actual = np.asarray(actual).astype(np.float64)
            assert np.isfinite(actual).all(), f"{name}: NaN or inf from finite inputs"
            inside = (actual >= low - slack) & (actual <= high + slack)
            assert np.where(unseen, actual == 0, inside).all(), name

    with jax_context(dtype):
        check()


@st.composite
def softmax_inputs(draw, dtype: str):
    """(3, 7) finite values of ``dtype`` up to its largest, some rows at the top of the range."""
    largest = float(ml_dtypes.finfo(DTYPES[dtype]).max)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = 2.0 ** draw(exponents(-20, int(np.log2(largest)) - 1))
    with np.errstate(over="ignore"):  # beyond the dtype's range: clipped to its largest
        x = np.clip(rng.standard_normal((3, 7)) * scale, -largest, largest)
    x[0, rng.integers(0, 7)] = largest * draw(st.sampled_from([1, -1]))  # the range's ends
    return x.astype(DTYPES[dtype])


def expected_softmax(x):
    return torch.softmax(torch.from_numpy(np.asarray(x).astype(np.float64)), dim=-1).numpy()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_softmax_matches_torch_at_every_magnitude(dtype):
    """Alone, and scaled inside the caller's ``jax.jit``: the expected values are torch's on the
    scaled values rounded to the dtype (what the caller's x / sqrt(8) holds)."""
    scale = DTYPES[dtype](8**-0.5)
    paths = {"jax": jax_attn.softmax, "jax jit": jax.jit(jax_attn.softmax)}
    if dtype in NUMPY_DTYPES:
        paths["numpy"] = numpy_attn.softmax
    scaled = jax.jit(lambda x: jax_attn.softmax(x * scale))

    @SETTINGS
    @given(softmax_inputs(dtype))
    def check(x):
        for name, path in paths.items():
            assert_matches(name, expected_softmax(x), path(x if name == "numpy" else jnp.asarray(x)), dtype)
        assert_matches("jax jit, scaled", expected_softmax(x * scale), scaled(jnp.asarray(x)), dtype)

    with jax_context(dtype):
        check()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_long_half_precision_row_is_float32s_softmax_rounded_once(dtype):
    """4096 keys in float16 or bfloat16: each weight within one unit in the last place of float32's
    softmax of the same values rounded to the dtype (the sums accumulate in float32). Accumulated in
    the half dtype itself, the weights stray up to 6 units (float16) from it in this row."""
    x = (np.random.default_rng(0).standard_normal((4, 4096)) * 2).astype(DTYPES[dtype])
    shifted = x.astype(np.float32) - x.astype(np.float32).max(axis=-1, keepdims=True)
    expected = (np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)).astype(DTYPES[dtype])
    paths = {"jax": jax_attn.softmax, "jax jit": jax.jit(jax_attn.softmax)}
    if dtype in NUMPY_DTYPES:
        paths["numpy"] = numpy_attn.softmax
    for name, path in paths.items():
        actual = np.asarray(path(x if name == "numpy" else jnp.asarray(x)))
        assert actual.dtype == expected.dtype, name
        ulps = np.abs(actual.view(np.int16).astype(np.int32) - expected.view(np.int16).astype(np.int32))
        assert ulps.max() <= 1, f"{name}: {ulps.max()} units in the last place from float32's softmax"


@pytest.mark.parametrize("implementation", ["reference", "blockwise"])
@pytest.mark.parametrize(
    "layer, dtype, magnitude",
    [
        ("CausalAttention", "float32", 1e6),
        ("CausalAttention", "bfloat16", 3e5),
        ("MultiHeadAttention", "float32", 1e6),
    ],
)
def test_the_issues_layer_reproducer_gives_torchs_output(layer, dtype, magnitude, implementation):
    """Scores ~ 1e12 (float32): one key takes a query's every weight, in torch, numpy_attn and
    jax_attn, eager and jitted (jax_attn's reference path gave 24 NaN in float32, 16 in bfloat16)."""
    case = Case(layer, batch=2, tokens=16, d_in=8, d_out=8, num_heads=2, dtype="float32", seed=0)
    module = case.build_torch()
    params, x = to_params(module), case.make_input(scale=magnitude)
    expected = module(torch.from_numpy(x)).detach().numpy()
    fast = {"implementation": implementation, "block_size": 4}
    cast = functools.partial(jax.tree.map, lambda a: jnp.asarray(a, DTYPES[dtype]))
    call = functools.partial(getattr(jax_attn, case.function_name), **case.kwargs(), **fast)
    outputs = {"jax": call(*cast((params, x))), "jax jit": jax.jit(call)(*cast((params, x)))}
    if dtype == "float32":
        outputs["numpy"] = getattr(numpy_attn, case.function_name)(params, x, **case.kwargs(), **fast)
    for name, actual in outputs.items():
        assert np.isfinite(np.asarray(actual, np.float64)).all(), name
        rtol, atol = tolerance_for(dtype)
        row = compare_arrays(name, expected, np.asarray(actual, np.float32), rtol=rtol, atol=atol)
        assert row.ok, row


@pytest.mark.parametrize("path", ["reference", "blockwise", "ring"])
def test_gradients_stay_finite_at_large_magnitudes(path):
    """Scores ~ 1e20 that round (a head of size 1): finite gradients on every JAX path, the ring's
    backward pass (which recomputes its scores) included."""
    rng = np.random.default_rng(5)
    shape = (*SHAPE[:-1], 1)
    queries, keys = (jnp.asarray(rng.standard_normal(shape) * 1e10, jnp.float32) for _ in range(2))
    values = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    function = attention_paths("float32")[f"jax {path}"]
    grads = jax.jit(jax.grad(lambda *a: function(*a, None).sum(), argnums=(0, 1, 2)))(queries, keys, values)
    for grad in grads:
        assert np.isfinite(np.asarray(grad)).all()
