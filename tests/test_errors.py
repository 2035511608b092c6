"""Bad input: a clear ValueError/TypeError naming the argument and the shapes, raised up front.

Each row of ``BAD_INPUTS`` changes one thing in a valid call and names the error it expects.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import pytest

import jax_attn
from parity_tests.cases import Case
from parity_tests.frameworks import layer_function
from torch_ref import to_params


@dataclass
class Call:
    params: dict[str, Any]
    x: Any
    args: list[Any]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class BadInput:
    name: str
    layer: str
    change: Callable[[Call], None]
    error: type[Exception]
    match: str


def valid_call(layer: str) -> Call:
    """A valid call: B=2, T=6, context 6, d_in=3, d_out=4 (fused: hidden_size 8), 2 heads."""
    d_out = 8 if layer.startswith("Fused") else 4
    case = Case(layer, batch=2, tokens=6, d_in=3, d_out=d_out, num_heads=2, bias=True, seed=0)
    return Call(to_params(case.build_torch()), case.make_input(), [], case.kwargs())


def put(**kwargs):
    return lambda call: call.kwargs.update(kwargs)


def set_x(make):
    def change(call):
        call.x = make(call.x)

    return change


def set_param(key, make):
    def change(call):
        call.params[key] = make(call.params.get(key))

    return change


def drop_param(key):
    return lambda call: call.params.pop(key)


def with_padding(mask):
    return lambda call: call.args.append(mask)


MHA, FCA = "MultiHeadAttention", "FusedCausalAttention"
BAD_INPUTS = [
    BadInput(
        "rank_2_input",
        MHA,
        set_x(lambda x: x[0]),
        ValueError,
        r"x must have shape \(B, T, D\), got shape \(6, 3\) \(rank 2\)",
    ),
    BadInput(
        "rank_3_input_to_v1",
        "SelfAttentionV1",
        set_x(lambda x: x[None]),
        ValueError,
        r"x must have shape \(T, D\), got shape \(1, 6, 3\) \(rank 3\)",
    ),
    BadInput(
        "feature_width",
        MHA,
        set_x(lambda x: np.zeros((2, 6, 5), x.dtype)),
        ValueError,
        r"x has 5 features \(shape \(2, 6, 5\)\) but the weights expect d_in=3",
    ),
    BadInput(
        "d_out_not_divisible", MHA, put(num_heads=3), ValueError, r"d_out=4 is not divisible by num_heads=3"
    ),
    BadInput(
        "hidden_not_divisible_multi",
        "FusedMultiHeadAttention",
        put(num_heads=3),
        ValueError,
        r"hidden_size=8 is not divisible by num_heads=3",
    ),
    BadInput(
        "hidden_not_divisible_causal",
        FCA,
        put(num_heads=3),
        ValueError,
        r"hidden_size=8 is not divisible by num_heads=3",
    ),
    BadInput("num_heads_zero", MHA, put(num_heads=0), ValueError, r"num_heads must be a positive int, got 0"),
    BadInput(
        "num_heads_disagrees_with_weights",
        "MultiHeadAttentionWrapper",
        put(num_heads=3),
        ValueError,
        r"num_heads=3 contradicts the weights: they hold 2 heads \(heads.0 to heads.1\), so num_heads=2",
    ),
    BadInput(
        "longer_than_context_length",
        MHA,
        put(context_length=5),
        ValueError,
        r"x has 6 tokens \(shape \(2, 6, 3\)\) but context_length is 5",
    ),
    BadInput(
        "longer_than_context_size",
        FCA,
        put(context_size=4),
        ValueError,
        r"x has 6 tokens \(shape \(2, 6, 8\)\) but context_size is 4",
    ),
    BadInput(
        "no_tokens",
        "CausalAttention",
        set_x(lambda x: x[:, :0]),
        ValueError,
        r"x must not have an empty axis, got shape \(2, 0, 3\) for \(B, T, D\)",
    ),
    BadInput(
        "empty_batch",
        MHA,
        set_x(lambda x: x[:0]),
        ValueError,
        r"x must not have an empty axis, got shape \(0, 6, 3\)",
    ),
    BadInput(
        "integer_input",
        MHA,
        set_x(lambda x: x.astype(np.int64)),
        TypeError,
        r"^x must have a floating dtype \(float16, float32, float64; bfloat16 in jax_attn\), "
        r"got int64 with shape \(2, 6, 3\)(\n|$)",
    ),
    BadInput(
        "complex_input",
        "SelfAttentionV2",
        set_x(lambda x: x.astype(np.complex128)),
        TypeError,
        r"^x must have a floating dtype \(float16, float32, float64; bfloat16 in jax_attn\), "
        r"got complex128 with shape \(6, 3\)(\n|$)",
    ),
    BadInput(
        "input_not_an_array",
        "SelfAttentionV2",
        set_x(lambda x: x.tolist()),
        TypeError,
        r"x must be an array, got list",
    ),
    BadInput(
        "dtype_mismatch",
        MHA,
        set_x(lambda x: x.astype(np.float64)),
        TypeError,
        r"params\['W_query.weight'\] has dtype float32 but x has dtype float64",
    ),
    BadInput("dropout_one", MHA, put(dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
    BadInput(
        "dropout_negative",
        "CausalAttention",
        put(dropout=-0.1),
        ValueError,
        r"dropout must be in \[0, 1\), got -0.1",
    ),
    BadInput(
        "dropout_not_a_number",
        MHA,
        put(dropout="0.1"),
        TypeError,
        r"dropout must be a float in \[0, 1\), got str",
    ),
    BadInput(
        "attn_drop_above_one", FCA, put(attn_drop=1.5), ValueError, r"attn_drop must be in \[0, 1\), got 1.5"
    ),
    BadInput(
        "keep_mask_shape",
        MHA,
        put(attn_keep_mask=np.ones((2, 6, 6), bool)),
        ValueError,
        r"attn_keep_mask must be a bool array of shape the dropped array's shape = "
        r"\(2, 2, 6, 6\), got bool array of shape \(2, 6, 6\)",
    ),
    BadInput(
        "keep_mask_dtype",
        "CausalAttention",
        put(attn_keep_mask=np.ones((2, 6, 6))),
        ValueError,
        r"attn_keep_mask must be a bool array .* = \(2, 6, 6\), got float64 array of shape \(2, 6, 6\)",
    ),
    BadInput(
        "out_keep_mask_shape",
        FCA,
        put(out_keep_mask=np.ones((2, 6, 4), bool)),
        ValueError,
        r"out_keep_mask must be a bool array .* = \(2, 6, 8\), got bool array of shape \(2, 6, 4\)",
    ),
    BadInput(
        "padding_mask_shape",
        FCA,
        with_padding(np.zeros((2, 5), bool)),
        ValueError,
        r"padding_mask must be a bool array of shape \(B, S\) = \(2, 6\), got bool array of shape \(2, 5\)",
    ),
    BadInput(
        "padding_mask_dtype",
        FCA,
        with_padding(np.zeros((2, 6), np.int64)),
        ValueError,
        r"padding_mask must be a bool array of shape \(B, S\) = \(2, 6\), got int64 array",
    ),
    BadInput(
        "missing_weight",
        MHA,
        drop_param("W_key.weight"),
        ValueError,
        r"params do not fit MultiHeadAttention: missing keys \['W_key.weight'\]",
    ),
    BadInput(
        "missing_primary_weight",
        FCA,
        drop_param("Wqkv.weight"),
        ValueError,
        r"params do not fit FusedCausalAttention: missing keys \['Wqkv.weight'\]",
    ),
    BadInput(
        "unexpected_weight",
        "SelfAttentionV2",
        set_param("mask", lambda _: np.ones((6, 6), np.float32)),
        ValueError,
        r"params do not fit SelfAttentionV2: unexpected keys \['mask'\]",
    ),
    BadInput(
        "misshaped_weight",
        MHA,
        set_param("out_proj.weight", lambda w: w[:, :3]),
        ValueError,
        r"mis-shaped keys: 'out_proj.weight' has shape \(4, 3\), expected \(4, 4\)",
    ),
    BadInput(
        "non_finite_weight",
        FCA,
        set_param("Wo.weight", lambda w: np.where(w > 0, np.inf, w)),
        ValueError,
        r"params\['Wo.weight'\] has non-finite values",
    ),
    BadInput(
        "params_not_a_mapping",
        MHA,
        lambda call: setattr(call, "params", list(call.params.items())),
        TypeError,
        r"params must be a mapping of str to arrays, got list",
    ),
    BadInput(
        "fused_single_head_too_narrow",
        "FusedSingleHeadAttention",
        set_param("Wqkv.weight", lambda w: w[:3, :3]),
        ValueError,
        r"hidden_size=3 must be at least 4 for FusedSingleHeadAttention",
    ),
]


# Keyword arguments that a Flax module takes in ``from_params``; the others go to ``__call__``.
CONSTRUCTOR_ARGS = {"num_heads", "context_length", "context_size", "dropout", "attn_drop", "out_drop"}


def call_function(framework: str, layer: str, call: Call) -> None:
    layer_function(framework, layer)(call.params, call.x, *call.args, **call.kwargs)


def call_flax_module(layer: str, call: Call) -> None:
    """Build the module from the weights, then call it: each error surfaces at one of the two.
    64-bit types are enabled so that a float64 x meets the dtype check (without them a module
    refuses it first with JAX's x64 hint: tests/test_nnx_modules.py)."""
    built = {k: v for k, v in call.kwargs.items() if k in CONSTRUCTOR_ARGS}
    called = {k: v for k, v in call.kwargs.items() if k not in CONSTRUCTOR_ARGS}
    with jax.enable_x64(True):
        module = getattr(jax_attn, layer).from_params(call.params, **built)
        module(call.x, *call.args, **called)


CALLERS = {
    "numpy_attn": lambda layer, call: call_function("numpy", layer, call),
    "jax_attn": lambda layer, call: call_function("jax", layer, call),
    "jax_attn_jit": lambda layer, call: call_jitted(layer, call),
    "flax_module": call_flax_module,
}


def call_jitted(layer: str, call: Call) -> None:
    """Under jax.jit the shapes and dtypes are checked while tracing (constructor args static).
    64-bit types are enabled so that jit keeps float64/int64/complex128 inputs as they are."""
    static = {k: v for k, v in call.kwargs.items() if k in CONSTRUCTOR_ARGS}
    dynamic = {k: v for k, v in call.kwargs.items() if k not in CONSTRUCTOR_ARGS}
    fn = functools.partial(layer_function("jax", layer), **static)
    with jax.enable_x64(True):
        jax.jit(fn)(call.params, call.x, *call.args, **dynamic)


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[bad.name for bad in BAD_INPUTS])
def test_bad_input_is_rejected_with_the_same_error_everywhere(bad, caller):
    if caller == "jax_attn_jit" and bad.name in VALUE_CHECKS:
        pytest.skip("weight values are unknown while tracing; they are checked where concrete")
    call = valid_call(bad.layer)
    CALLERS[caller](bad.layer, call)  # the unchanged call is valid
    bad.change(call)
    # jax.jit refuses a list of (str, array) pairs itself, with a TypeError of its own
    match = None if caller == "jax_attn_jit" and bad.name == "params_not_a_mapping" else bad.match
    with pytest.raises(bad.error, match=match):
        CALLERS[caller](bad.layer, call)


VALUE_CHECKS = {"non_finite_weight"}


@pytest.mark.parametrize("what", ["layer", "gpt_model"])
def test_known_non_finite_weights_are_refused_under_jit_too(what):
    """Weights closed over as arrays are known while x (or the token ids) is traced: their NaN is
    refused as in an eager call (their whole output was NaN)."""
    if what == "layer":
        call = valid_call("MultiHeadAttention")
        params = {**call.params, "W_key.weight": np.full_like(call.params["W_key.weight"], np.nan)}
        static = {k: v for k, v in call.kwargs.items() if k in CONSTRUCTOR_ARGS}
        fn, arguments = functools.partial(jax_attn.multi_head_attention, params, **static), (call.x,)
    else:
        from tests.gpt_cases import TINY, token_ids, torch_model

        params = to_params(torch_model())
        params["trf_blocks.0.att.W_key.weight"][0, 0] = np.inf
        fn, arguments = functools.partial(jax_attn.gpt_model, params, config=TINY), (token_ids(),)
    with pytest.raises(ValueError, match=r"W_key\.weight'\] has non-finite values \(NaN or inf\)"):
        jax.jit(fn)(*arguments)


def test_table_is_large_and_names_are_unique():
    assert len(BAD_INPUTS) >= 25
    assert len({bad.name for bad in BAD_INPUTS}) == len(BAD_INPUTS)
