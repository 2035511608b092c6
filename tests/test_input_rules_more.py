"""More input rules, the same error in numpy_attn and jax_attn: causal_mask's arguments,
softmax's edge cases, NumPy's matrix and masked-array subclasses."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
import numpy_attn

PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}

# ------------------------------------------------------------------ causal_mask

BAD_MASK_ARGS = [
    ((2.0,), {}, TypeError, "num_queries must be a positive int, got 2.0 (float)"),
    ((True,), {}, TypeError, "num_queries must be a positive int, got True (bool)"),
    ((0,), {}, ValueError, "num_queries must be a positive int, got 0"),
    ((-2,), {}, ValueError, "num_queries must be a positive int, got -2"),
    (([3],), {}, TypeError, "num_queries must be a positive int, got [3] (list)"),
    ((3, 2.5), {}, TypeError, "num_keys must be a positive int, got 2.5 (float)"),
    ((3, -1), {}, ValueError, "num_keys must be a positive int, got -1"),
    ((3, 4), {"offset": 1.5}, TypeError, "offset must be an int, got 1.5 (float)"),
    ((3, 4), {"offset": True}, TypeError, "offset must be an int, got True (bool)"),
    ((3, 4), {"offset": [1]}, TypeError, "offset must be an int, got [1] (list)"),
]


@pytest.mark.parametrize("args, kwargs, error, message", BAD_MASK_ARGS, ids=[repr(a) for a in BAD_MASK_ARGS])
@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_causal_mask_refuses_bad_arguments_alike(package, args, kwargs, error, message):
    """Unhashable arguments too (numpy_attn checks before its cache: not 'unhashable type')."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        PACKAGES[package].causal_mask(*args, **kwargs)


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_causal_mask_takes_numpy_ints_and_offsets_of_either_sign(package):
    causal_mask = PACKAGES[package].causal_mask
    expected = np.array([[False, True, True], [False, False, True]])
    np.testing.assert_array_equal(causal_mask(np.int64(2), np.int32(3)), expected)
    np.testing.assert_array_equal(causal_mask(2, 3, offset=np.int64(1)), [[False, False, True], [False] * 3])
    np.testing.assert_array_equal(causal_mask(2, 3, offset=-1), [[True] * 3, [False, True, True]])


BIG_OFFSET = (
    "offset must satisfy |offset| + max(num_queries, num_keys) <= 2**31 - 1 (positions are int32 in jax_attn)"
)


@pytest.mark.parametrize(
    "offset, given",
    [
        (2**31 - 3, "2147483645"),  # jax_attn's int32 positions wrapped: the last row hid every key
        (-(2**31 - 3), "-2147483645"),
        (2**31, "2147483648"),  # jax_attn: a raw OverflowError
        (np.int64(2**63 - 2), "9223372036854775806"),  # numpy_attn's int64 wrapped too
        (-(2**63), "-9223372036854775808"),
        (2**70, "an int of 71 bits"),  # numpy_attn: a raw OverflowError
    ],
)
@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_causal_mask_refuses_an_offset_whose_positions_would_wrap(package, offset, given):
    message = f"{BIG_OFFSET}, got offset={given} with (num_queries, num_keys) = (3, 3)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        PACKAGES[package].causal_mask(np.int64(3), 3, offset)


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_causal_mask_gives_one_mask_up_to_the_offsets_bound(package):
    causal_mask = PACKAGES[package].causal_mask
    bound = 2**31 - 1 - 3
    np.testing.assert_array_equal(causal_mask(2, 3, bound), np.zeros((2, 3), bool))
    np.testing.assert_array_equal(causal_mask(2, 3, -bound), np.ones((2, 3), bool))
    np.testing.assert_array_equal(causal_mask(2, 3, np.uint64(bound)), np.zeros((2, 3), bool))
    if package == "jax":  # a concrete array offset is checked as an int is
        with pytest.raises(ValueError, match=f"^{re.escape(BIG_OFFSET)}, got offset=2147483645 with"):
            causal_mask(2, 3, jnp.int32(bound + 1))


def test_jax_causal_mask_takes_a_traced_or_array_offset():
    expected = np.asarray(jax_attn.causal_mask(2, 4, offset=1))
    np.testing.assert_array_equal(jax_attn.causal_mask(2, 4, offset=jnp.int32(1)), expected)
    traced = jax.jit(lambda offset: jax_attn.causal_mask(2, 4, offset=offset))(jnp.int32(1))
    np.testing.assert_array_equal(traced, expected)
    with pytest.raises(TypeError, match=r"^offset must be an int, got "):
        jax_attn.causal_mask(2, 4, offset=jnp.float32(1))


# ------------------------------------------------------------------ softmax

SOFTMAXES = ["softmax", "softmax_naive"]


@pytest.mark.parametrize("fn", SOFTMAXES)
@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_softmax_refuses_a_0d_input_or_an_axis_out_of_range_alike(package, fn):
    softmax = getattr(PACKAGES[package], fn)
    with pytest.raises(ValueError, match=r"^axis -1 is out of bounds for x of shape \(\)$"):
        softmax(np.float32(1))
    with pytest.raises(ValueError, match=r"^axis 2 is out of bounds for x of shape \(2, 3\)$"):
        softmax(np.zeros((2, 3), np.float32), axis=2)
    with pytest.raises(ValueError, match=r"^axis -3 is out of bounds for x of shape \(2, 3\)$"):
        softmax(np.zeros((2, 3), np.float32), axis=-3)
    with pytest.raises(TypeError, match=r"^axis must be an int, got 1.0 \(float\)$"):
        softmax(np.zeros((2, 3), np.float32), axis=1.0)


@pytest.mark.parametrize("fn", SOFTMAXES)
@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_softmax_of_an_empty_axis_is_empty(package, fn):
    softmax = getattr(PACKAGES[package], fn)
    for shape, axis in (((2, 0), -1), ((0, 3), 0), ((0, 3), 1)):
        weights = np.asarray(softmax(np.zeros(shape, np.float32), axis=axis))
        assert weights.shape == shape and weights.dtype == np.float32
    weights = jax.jit(jax_attn.softmax)(jnp.zeros((2, 0), jnp.float32))
    assert weights.shape == (2, 0)


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_softmax_naive_has_softmaxs_input_checks(package):
    """Not NumPy's or JAX's raw (and differing) errors for a torch tensor or an int array."""
    torch = pytest.importorskip("torch")
    softmax_naive = PACKAGES[package].softmax_naive
    with pytest.raises(TypeError) as checked:
        PACKAGES[package].softmax(torch.zeros(2, 3))
    assert str(checked.value).startswith("x ")
    with pytest.raises(TypeError, match=f"^{re.escape(str(checked.value))}$"):
        softmax_naive(torch.zeros(2, 3))
    message = "x must have a floating dtype"
    with pytest.raises(TypeError, match=f"^{message}"):
        softmax_naive(np.zeros((2, 3), np.int64))
    np.testing.assert_allclose(
        np.asarray(softmax_naive(np.array([0.0, np.log(3.0)], np.float32))), [0.25, 0.75], rtol=1e-6
    )


def test_jax_simplified_self_attention_refuses_float64_without_x64():
    """It computed float64 in float32 without a word; the layers' check_x64 error now."""
    x = np.ones((3, 2), np.float64)
    with pytest.raises(TypeError, match=r"^x has dtype float64, which JAX computes in float32"):
        jax_attn.simplified_self_attention(x)
    with jax.enable_x64(True):
        assert jax_attn.simplified_self_attention(x).dtype == np.float64


# ------------------------------------------------------------------ NumPy subclasses

MATRIX = "must be an array, got numpy.matrix (always 2-D, * a matrix product): pass np.asarray"
MASKED = "must be an array, got numpy.ma.MaskedArray, whose mask would be ignored: pass "
_RNG = np.random.default_rng(0)
_X = _RNG.standard_normal((4, 4)).astype(np.float32)
_QKV = {
    f"{name}.weight": _RNG.standard_normal((4, 4)).astype(np.float32)
    for name in ("W_query", "W_key", "W_value")
}
_MHA = {**_QKV, "out_proj.weight": _X.copy(), "out_proj.bias": np.zeros(4, np.float32)}
_CONFIG = {"vocab_size": 5, "context_length": 4, "emb_dim": 4, "n_heads": 2, "n_layers": 1, "drop_rate": 0.0,
           "qkv_bias": False}  # fmt: skip
_GPT = {k: np.ones(shape, np.float32) for k, shape in numpy_attn.gpt_param_shapes(_CONFIG).items()}


def _masked(array):
    return np.ma.masked_array(array, np.zeros(array.shape, bool))


# (call, the message): before, numpy_attn computed matrix algebra (dropout's * on a square
# matrix a matrix product, a layer's output a 2-D matrix), ignored a masked array's mask or
# raised NumPy's own errors, and jax_attn computed or raised JAX's "masked arrays are not
# supported"
def _matrix_weights(params):
    return {key: np.matrix(value) if value.ndim == 2 else value for key, value in params.items()}


SUBCLASSES = {
    "dropout(matrix x)": (lambda p: p.dropout(np.matrix(_X), 0.5, keep_mask=_X > 0), f"x {MATRIX}(x)"),
    "softmax(masked x)": (lambda p: p.softmax(_masked(_X)), f"x {MASKED}x.filled(value)"),
    "linear(matrix weight)": (lambda p: p.linear(_X, np.matrix(_X)), f"weight {MATRIX}(weight)"),
    "sdpa(masked mask)": (
        lambda p: p.scaled_dot_product_attention(_X, _X, _X, mask=_masked(_X > 0)),
        f"mask {MASKED}mask.filled(value)",
    ),
    "causal_attention(matrix weights)": (
        lambda p: p.causal_attention(_matrix_weights(_QKV), _X[None], context_length=4),
        f"params['W_query.weight'] {MATRIX}(params['W_query.weight'])",
    ),
    "causal_attention(masked x)": (
        lambda p: p.causal_attention(_QKV, _masked(_X[None]), context_length=4),
        f"x {MASKED}x.filled(value)",
    ),
    "multi_head_attention(masked keep-mask)": (
        lambda p: p.multi_head_attention(
            _MHA,
            _X[None],
            num_heads=2,
            context_length=4,
            dropout=0.5,
            attn_keep_mask=_masked(np.ones((1, 2, 4, 4), bool)),
        ),
        f"attn_keep_mask {MASKED}attn_keep_mask.filled(value)",
    ),
    "gpt_model(matrix weights)": (
        lambda p: p.gpt_model(_matrix_weights(_GPT), np.ones((1, 2), int), _CONFIG),
        f"params['tok_emb.weight'] {MATRIX}(params['tok_emb.weight'])",
    ),
    "gpt_model(masked token_ids)": (
        lambda p: p.gpt_model(_GPT, _masked(np.ones((1, 2), int)), _CONFIG),
        f"token_ids {MASKED}token_ids.filled(value)",
    ),
}


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix's
@pytest.mark.parametrize("case", list(SUBCLASSES))
@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_matrix_and_masked_arrays_are_refused_alike(package, case):
    call, message = SUBCLASSES[case]
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        call(PACKAGES[package])


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_flax_modules_refuse_matrix_weights_and_masked_inputs_as_the_functions_do():
    message = f"params['W_query.weight'] {MATRIX}(params['W_query.weight'])"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.MultiHeadAttention.from_params(_matrix_weights(_MHA), num_heads=2, context_length=4)
    module = jax_attn.MultiHeadAttention.from_params(_MHA, num_heads=2, context_length=4)
    with pytest.raises(TypeError, match=f"^{re.escape(f'x {MASKED}x.filled(value)')}$"):
        module(_masked(_X[None]))


class _Plain(np.ndarray):
    """A subclass that behaves as an ndarray (as np.memmap does): accepted."""


def test_other_ndarray_subclasses_are_accepted():
    np.testing.assert_array_equal(numpy_attn.softmax(_X.view(_Plain)), numpy_attn.softmax(_X))
