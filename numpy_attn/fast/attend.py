"""The attention core by implementation, and a whole layer on its fast path: written once for both
packages, computing with the ``Framework`` it is given (its ``ops``, its blockwise functions).

``attend`` runs ``scaled_dot_product_attention`` (the notes' math) or ``blockwise_attention``
(O(T) memory) as ``ComputePath`` says; ``attend_heads`` adds the projections and the head split
around it; ``fast_layer`` is a layer of ``numpy_attn.spec`` on its blockwise path, built from its
spec's structure (how it projects, whether it is causal, what it drops).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numpy_attn.fast.options import AttnDropout, ComputePath, Masking, fuses_projections, uses_blockwise
from numpy_attn.fast.projections import qkv_projections, qkv_weights, split_projection
from numpy_attn.spec import SPECS, LayerSpec
from numpy_attn.steps import Steps

__all__ = ["attend", "attend_heads", "fast_layer"]


def attend(
    fw: Any,
    queries: Any,
    keys: Any,
    values: Any,
    masking: Masking = Masking(),
    dropout: AttnDropout = AttnDropout(),
    path: ComputePath = ComputePath(),
    return_steps: bool = False,
) -> tuple[Any, Steps]:
    """Attention of queries over keys and values on ``path.implementation``'s path.

    Args:
        queries: ``(..., T, H)``; keys ``(..., S, H)`` and values ``(..., S, Hv)``, with the
            queries' leading axes.
        masking: what hides keys (the padding mask's B is the queries' first axis, 1 for
            ``(T, H)`` queries).
        dropout: on the attention weights; path: how to compute.
        return_steps: also the ``(..., T, S)`` steps, from the reference math on either path
            (random dropout then draws one keep-mask that both use).
    Returns:
        ``(context_vec (..., T, Hv), steps)``; steps is empty without ``return_steps``.
    """
    blockwise = uses_blockwise(path.implementation, queries.shape[-2])
    random, keep_mask, steps = dropout.rng, dropout.keep_mask, Steps()
    if blockwise and return_steps and random is not None and dropout.rate:  # one draw for both paths
        keep_shape = (*queries.shape[:-1], keys.shape[-2])  # (..., T, S)
        keep_mask, random = fw.ops.draw_keep_mask(random, dropout.rate, keep_shape), None
    if not blockwise or return_steps:
        context_vec, steps = _reference(fw, queries, keys, values, masking, dropout.rate, random, keep_mask)
        if not blockwise:
            return context_vec, steps
    context_vec = fw.blockwise_attention(
        queries, keys, values, causal=masking.causal, padding_mask=masking.padding_mask, dropout=dropout.rate,
        attn_keep_mask=keep_mask, block_size=path.block_size, **{fw.random: random},
    )  # fmt: skip
    return context_vec, steps


def _reference(
    fw: Any, queries: Any, keys: Any, values: Any, masking: Masking, rate: Any, random: Any, keep_mask: Any
) -> tuple[Any, Steps]:
    """``scaled_dot_product_attention`` with the mask ``masking`` makes."""
    mask = fw.ops.causal_mask(queries.shape[-2], keys.shape[-2]) if masking.causal else None  # (T, S)
    if masking.padding_mask is not None:  # (B, S) -> (B, 1, ..., 1, S), the queries' rank
        padding = masking.padding_mask
        hidden_keys = padding.reshape(padding.shape[:1] + (1,) * (queries.ndim - 2) + padding.shape[1:])
        mask = hidden_keys if mask is None else mask | hidden_keys  # (B, 1, ..., T, S)
    return fw.ops.scaled_dot_product_attention(
        queries, keys, values, mask, dropout=rate, attn_keep_mask=keep_mask, **{fw.random: random}
    )  # (..., T, Hv)


def attend_heads(
    fw: Any,
    x: Any,
    qkv: tuple[Any, Any],
    num_heads: int,
    masking: Masking = Masking(),
    dropout: AttnDropout = AttnDropout(),
    path: ComputePath = ComputePath(),
    return_steps: bool = False,
) -> tuple[Any, Steps]:
    """Multi-head self-attention up to the output projection: x projected by ``qkv`` (in one
    matmul if ``path.fused_qkv``, else three), split into ``num_heads`` heads, ``attend``-ed,
    merged back. On the blockwise path without steps, each head is projected inside the loop over
    heads (``blockwise_self_attention``): no ``(B, T, 3E)`` projection is ever stored.

    Args:
        x: ``(B, T, D)``.
        qkv: ``(weight (3E, D), bias (3E,) or None)``, torch's layout: the rows of W_query, W_key,
            W_value (note 003's ``Wqkv``).
        num_heads: N, dividing E; masking, dropout, path, return_steps: as ``attend``'s (the
            keep-mask ``(B, N, T, T)``).
    Returns:
        ``(context_vec (B, T, E), steps)``: with ``return_steps``, the projections ``queries``,
        ``keys``, ``values`` ``(B, T, E)`` and ``attend``'s steps.
    """
    if uses_blockwise(path.implementation, x.shape[-2]) and not return_steps:
        context_vec = fw.blockwise_self_attention(
            x, *qkv, num_heads=num_heads, causal=masking.causal, padding_mask=masking.padding_mask,
            dropout=dropout.rate, attn_keep_mask=dropout.keep_mask, block_size=path.block_size,
            **{fw.random: dropout.rng},
        )  # fmt: skip
        return context_vec, Steps()
    queries, keys, values = split_projection(fw, x, *qkv, fused=path.fused_qkv)  # 3 x (B, T, E)
    heads = [fw.ops.split_heads(a, num_heads) for a in (queries, keys, values)]  # 3 x (B, N, T, H)
    context_vec, steps = attend(fw, *heads, masking, dropout, path, return_steps)  # (B, N, T, H)
    if return_steps:
        steps = Steps(queries=queries, keys=keys, values=values, **steps)
    return fw.ops.merge_heads(context_vec), steps  # (B, T, E)


def fast_layer(
    spec: LayerSpec,
    fw: Any,
    params: Mapping[str, Any],
    x: Any,
    padding_mask: Any = None,
    *,
    implementation: str,
    block_size: int,
    return_steps: bool,
    **arguments: Any,
) -> tuple[Any, Steps]:
    """The layer of ``spec`` on the path ``implementation`` names (the blockwise one, where the
    door sends it): its projections, ``attend`` (or ``attend_heads``), its output projection and
    dropout.

    Args:
        params, x, padding_mask: the layer function's (checked by the door).
        implementation, block_size: the path; return_steps: whether the steps are wanted.
        arguments: the layer's other arguments (``num_heads``, dropout rates, keep-masks, the
            random source).
    Returns:
        ``(output, steps)`` as the layer's reference math returns them: the same step names, the
        ``(T, S)`` steps by the reference math (only with ``return_steps``).
    """
    random = arguments.get(fw.random)
    path = ComputePath(implementation, block_size, fuses_projections(implementation, x.shape[-2]))
    if spec.heads is not None:  # a stack of heads, each the layer spec.heads names
        return _stack(spec, fw, params, x, path, return_steps, random, arguments)
    rate = arguments[spec.dropouts[0]] if spec.dropouts else None
    attn_random, out_random = fw.split_random(random) if spec.out_dropout else (random, None)
    dropout = AttnDropout(rate, attn_random, arguments.get("attn_keep_mask"))
    masking = Masking(spec.causal, padding_mask)
    if spec.multi_head:
        qkv = _weights(params, "Wqkv") if spec.qkv == "fused" else qkv_weights(fw, params)  # (3E, D), (3E,)
        context_vec, steps = attend_heads(
            fw, x, qkv, arguments["num_heads"], masking, dropout, path, return_steps
        )
    else:
        queries, keys, values = _projections(spec, fw, params, x)  # 3 x (..., T, E)
        context_vec, steps = attend(fw, queries, keys, values, masking, dropout, path, return_steps)
        steps = Steps(queries=queries, keys=keys, values=values, **steps)
    steps = Steps(**steps, context_vec=context_vec)
    output = context_vec if spec.out is None else fw.ops.linear(context_vec, *_weights(params, spec.out))
    if spec.out_dropout is not None:
        steps["projected"] = output
        out_keep_mask = arguments.get("out_keep_mask")
        output = fw.ops.dropout(
            output, arguments[spec.out_dropout], keep_mask=out_keep_mask, **{fw.random: out_random}
        )
    return output, Steps(**steps, output=output)


def _weights(params: Mapping[str, Any], name: str) -> tuple[Any, Any]:
    return params[f"{name}.weight"], params.get(f"{name}.bias")


def _projections(spec: LayerSpec, fw: Any, params: Mapping[str, Any], x: Any) -> tuple[Any, Any, Any]:
    """Queries, keys and values of a single-head layer, as its class projects them."""
    if spec.qkv == "matrices":
        return x @ params["W_query"], x @ params["W_key"], x @ params["W_value"]
    if spec.qkv == "fused":
        return split_projection(fw, x, *_weights(params, "Wqkv"))
    return qkv_projections(fw, x, params)


def _stack(
    spec: LayerSpec, fw: Any, params: Mapping[str, Any], x: Any, path: ComputePath, return_steps: bool,
    random: Any, arguments: Mapping[str, Any],
) -> tuple[Any, Steps]:  # fmt: skip
    """The wrapper on the fast path: each head the fast ``spec.heads`` layer, outputs concatenated."""
    head_spec, keep_mask = SPECS[spec.heads], arguments.get("attn_keep_mask")
    head_arguments = {name: arguments[name] for name in head_spec.arguments}
    outputs, steps = [], Steps()
    for i in range(arguments["num_heads"]):
        prefix = f"heads.{i}."
        head_params = {name.removeprefix(prefix): w for name, w in params.items() if name.startswith(prefix)}
        output, head_steps = fast_layer(
            head_spec, fw, head_params, x, implementation=path.implementation, block_size=path.block_size,
            return_steps=return_steps, attn_keep_mask=None if keep_mask is None else keep_mask[:, i],
            **head_arguments, **{fw.random: fw.head_random(random, i)},
        )  # fmt: skip
        outputs.append(output)
        steps.update((prefix + name, value) for name, value in head_steps.items())
    context_vec = fw.xp.concatenate(outputs, axis=-1)  # (B, T, N * E)
    return context_vec, Steps(**steps, context_vec=context_vec, output=context_vec)
