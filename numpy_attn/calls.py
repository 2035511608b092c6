"""What each public building block of numpy_attn and jax_attn checks at its door.

One function per building block, named after it: ``check(fw, arguments)`` receives the
``Framework`` (its dtypes, its random source) and the call's arguments by name, and raises the
same TypeError or ValueError in both packages. The layers' checks come from their specs
(``door.check_layer_call``); these are the blocks' own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numpy_attn import checks
from numpy_attn.fast.options import AttnDropout, ComputePath, Masking, check_implementation
from numpy_attn.spec import QKV

A = Mapping[str, Any]  # a call's arguments by name


def softmax(fw: Any, a: A) -> None:
    fw.check_operands(x=a["x"])
    checks.check_axis(a["x"].shape, a["axis"])


softmax_naive = softmax


def causal_mask(fw: Any, a: A) -> None:
    checks.check_causal_mask_args(a["num_queries"], a["num_keys"], a["offset"], fw.array_types)


def dropout(fw: Any, a: A) -> None:
    fw.check_operands(x=a["x"])
    checks.check_dropout("p", a["p"])
    fw.check_random(a[fw.random])
    if a["keep_mask"] is not None:
        checks.check_keep_mask("keep_mask", a["keep_mask"], tuple(a["x"].shape))


def linear(fw: Any, a: A) -> None:
    fw.check_operands(x=a["x"], weight=a["weight"], bias=a["bias"], optional=("bias",))
    checks.check_linear_shapes(a["x"], a["weight"], a["bias"])


def split_heads(fw: Any, a: A) -> None:
    shape = checks.check_input(a["x"], layout="(B, T, E)", floating=fw.floats)
    fw.check_float64("x", a["x"])
    checks.check_divisible("E", shape[-1], a["num_heads"])


def merge_heads(fw: Any, a: A) -> None:
    checks.check_input(a["x"], layout="(B, N, T, H)", floating=fw.floats)
    fw.check_float64("x", a["x"])


def simplified_self_attention(fw: Any, a: A) -> None:
    checks.check_input(a["x"], layout="(T, D)", floating=fw.floats)
    fw.check_float64("x", a["x"])
    checks.check_flag("return_steps", a["return_steps"])


def scaled_dot_product_attention(fw: Any, a: A) -> None:
    queries, keys, values = a["queries"], a["keys"], a["values"]
    fw.check_operands(queries=queries, keys=keys, values=values)
    checks.check_attention_shapes(queries, keys, values)
    checks.check_scores_mask(a["mask"], queries, keys)
    checks.check_mask_operands(attn_keep_mask=a["attn_keep_mask"])
    fw.check_random(a[fw.random])
    if a["dropout"] is not None:
        checks.check_dropout("dropout", a["dropout"])
        if a["attn_keep_mask"] is not None:
            checks.check_keep_mask("attn_keep_mask", a["attn_keep_mask"], checks.scores_shape(queries, keys))
    checks.check_flag("return_steps", a["return_steps"])


def split_projection(fw: Any, a: A) -> None:
    linear(fw, a)
    check_parts(tuple(a["weight"].shape), a["parts"])
    checks.check_flag("fused", a["fused"])


def check_parts(weight_shape: tuple[int, ...], parts: Any) -> None:
    """A stacked ``(parts * E, D)`` weight: its rows cut into ``parts`` equal parts."""
    checks.check_size("parts", parts)
    if weight_shape[0] % parts:
        raise ValueError(f"weight of shape {weight_shape} does not cut into parts={parts!r} equal row blocks")


def qkv_params(params: Any, function: str) -> dict[str, Any]:
    """``params`` holding ``W_query``, ``W_key``, ``W_value`` (weights ``(E, D)`` of one shape) and
    the three biases ``(E,)`` or none: one ValueError naming every missing or mis-shaped key; other
    keys (a bigger layer's) are ignored. Returns them by the names the messages give them."""
    checks.check_mapping(params)
    weights, biases = ([f"{name}.{kind}" for name in QKV] for kind in ("weight", "bias"))
    given = [key for key in biases if key in params]
    keys = weights + biases if given else weights
    missing = [key for key in keys if key not in params]
    if missing:
        partial = (
            f" (biases for the three projections or none, got {given})" if given and given != biases else ""
        )
        raise ValueError(f"params do not fit {function}: missing keys {missing}{partial}")
    shapes = {key: checks.check_array(f"params[{key!r}]", params[key]) for key in keys}
    query = shapes[weights[0]]
    expected = (
        {weights[0]: "(E, D)"}
        if len(query) != 2
        else dict.fromkeys(weights, query) | dict.fromkeys(given, query[:1])
    )
    misshaped = [
        f"{key!r} has shape {shapes[key]}, expected {want}"
        for key, want in expected.items()
        if shapes[key] != want
    ]
    if misshaped:
        raise ValueError(f"params do not fit {function}: mis-shaped keys: " + "; ".join(misshaped))
    return {f"params[{key!r}]": params[key] for key in keys}


def qkv_weights(fw: Any, a: A) -> None:
    fw.check_operands(**qkv_params(a["params"], "qkv_weights"))


def qkv_projections(fw: Any, a: A) -> None:
    checks.check_flag("fused", a["fused"])
    fw.check_operands(x=a["x"], **qkv_params(a["params"], "qkv_projections"))
    checks.check_linear_shapes(a["x"], a["params"]["W_query.weight"], None, "params['W_query.weight']")


def check_causal_lengths(num_queries: int, num_keys: int) -> None:
    """Causal attention is self-attention: query t sees keys 0..t, so T = S."""
    if num_queries != num_keys:
        raise ValueError(
            f"causal attention needs T = S (self-attention), got T={num_queries}, S={num_keys}; for "
            "queries at other positions pass causal_mask(T, S, offset) to scaled_dot_product_attention"
        )


def check_leading_axes(queries: Any, keys: Any, values: Any) -> None:
    """Keys and values with the queries' leading axes: the blockwise path cuts its blocks per batch
    and head, where ``scaled_dot_product_attention`` broadcasts; checked on every path."""
    leading = tuple(queries.shape[:-2])
    for name, value in (("keys", keys), ("values", values)):
        if tuple(value.shape[:-2]) != leading:
            raise ValueError(
                f"{name} must have the leading axes {leading} of queries (the blockwise path cuts "
                f"its blocks per batch and head), got shape {tuple(value.shape)}"
            )


def _options(fw: Any, masking: Any, dropout: Any, path: Any, batch: int, num_queries: int, num_keys: int,
             keep_shape: tuple[int, ...]) -> None:  # fmt: skip
    """``attend``'s and ``attend_heads``' option groups, whatever the path."""
    for name, value, kind in (
        ("masking", masking, Masking),
        ("dropout", dropout, AttnDropout),
        ("path", path, ComputePath),
    ):
        if not isinstance(value, kind):
            raise TypeError(f"{name} must be a numpy_attn.{kind.__name__}, got {type(value).__name__}")
    checks.check_flag("causal", masking.causal)
    if masking.causal:
        check_causal_lengths(num_queries, num_keys)
    if masking.padding_mask is not None:
        checks.check_padding_mask(masking.padding_mask, batch, num_keys)
    checks.check_mask_operands(attn_keep_mask=dropout.keep_mask)
    if dropout.rate is not None:
        checks.check_dropout("dropout.rate", dropout.rate)
        if dropout.keep_mask is not None:
            checks.check_keep_mask("attn_keep_mask", dropout.keep_mask, keep_shape)
    fw.check_random(dropout.rng, "dropout.rng")
    checks.check_flag("path.fused_qkv", path.fused_qkv)
    check_implementation(path.implementation, path.block_size)


def attend(fw: Any, a: A) -> None:
    queries, keys, values = a["queries"], a["keys"], a["values"]
    fw.check_operands(queries=queries, keys=keys, values=values)
    checks.check_attention_shapes(queries, keys, values)
    check_leading_axes(queries, keys, values)
    batch = queries.shape[0] if queries.ndim > 2 else 1
    keep_shape = (*queries.shape[:-1], keys.shape[-2])
    _options(fw, a["masking"], a["dropout"], a["path"], batch, queries.shape[-2], keys.shape[-2], keep_shape)
    checks.check_flag("return_steps", a["return_steps"])


def attend_heads(fw: Any, a: A) -> None:
    x, qkv, num_heads = a["x"], a["qkv"], a["num_heads"]
    if not isinstance(qkv, (tuple, list)) or len(qkv) != 2:
        got = (
            f"{type(qkv).__name__} of length {len(qkv)}"
            if isinstance(qkv, (tuple, list))
            else type(qkv).__name__
        )
        raise TypeError(f"qkv must be a (weight, bias) pair, bias None for none, got {got}")
    fw.check_operands(x=x, **{"qkv[0]": qkv[0], "qkv[1]": qkv[1]}, optional=("qkv[1]",))
    shape = checks.check_input(x, layout="(B, T, D)", floating=fw.floats)
    checks.check_linear_shapes(x, *qkv)
    check_parts(tuple(qkv[0].shape), 3)
    checks.check_divisible("E", qkv[0].shape[0] // 3, num_heads)
    keep_shape = (shape[0], num_heads, shape[1], shape[1])
    _options(fw, a["masking"], a["dropout"], a["path"], shape[0], shape[1], shape[1], keep_shape)
    checks.check_flag("return_steps", a["return_steps"])


def blockwise_attention(fw: Any, a: A) -> None:
    queries, keys, values = a["queries"], a["keys"], a["values"]
    fw.check_operands(queries=queries, keys=keys, values=values)
    checks.check_attention_shapes(queries, keys, values)
    check_leading_axes(queries, keys, values)
    batch = queries.shape[0] if queries.ndim > 2 else 1
    _blockwise_args(fw, a, batch, queries.shape[-2], keys.shape[-2], (*queries.shape[:-1], keys.shape[-2]))


def blockwise_self_attention(fw: Any, a: A) -> None:
    x, weight, bias, num_heads = a["x"], a["weight"], a["bias"], a["num_heads"]
    fw.check_operands(x=x, weight=weight, bias=bias, optional=("bias",))
    shape = checks.check_input(x, layout="(B, T, D)", floating=fw.floats)
    weight_shape = tuple(weight.shape)
    if len(weight_shape) != 2 or weight_shape[1] != shape[-1]:
        raise ValueError(
            f"weight must have shape (3E, D) with D={shape[-1]} (x has shape {shape}), "
            f"got shape {weight_shape}"
        )
    checks.check_divisible("weight rows (3E)", weight_shape[0], num_heads)
    if weight_shape[0] % (3 * num_heads) != 0:
        raise ValueError(
            f"weight must stack 3 projections of num_heads={num_heads} equal heads, got shape {weight_shape}"
        )
    checks.check_bias(bias, weight_shape)
    _blockwise_args(fw, a, shape[0], shape[1], shape[1], (shape[0], num_heads, shape[1], shape[1]))


def _blockwise_args(
    fw: Any, a: A, batch: int, num_queries: int, num_keys: int, keep_shape: tuple[int, ...]
) -> None:
    """The blockwise functions' masks, random source, flag, block size and dropout rate."""
    checks.check_mask_operands(padding_mask=a["padding_mask"], attn_keep_mask=a["attn_keep_mask"])
    fw.check_random(a[fw.random])
    checks.check_flag("causal", a["causal"])
    if a["causal"]:
        check_causal_lengths(num_queries, num_keys)
    if a["padding_mask"] is not None:
        checks.check_padding_mask(a["padding_mask"], batch, num_keys)
    checks.check_size("block_size", a["block_size"])
    if a["dropout"] is not None:
        checks.check_dropout("dropout", a["dropout"])
    if a["attn_keep_mask"] is not None:
        checks.check_keep_mask("attn_keep_mask", a["attn_keep_mask"], keep_shape)
