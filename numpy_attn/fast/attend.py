"""The attention core by implementation (``attend``: ``scaled_dot_product_attention`` or
``blockwise_attention``, as ``ComputePath`` says), with the projections and heads around it
(``attend_heads``), and a layer of ``numpy_attn.spec`` on its fast path (``fast_layer``): written
once for both packages, computing with the ``Framework`` given (its ``ops``, its blockwise loops)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numpy_attn.fast.options import AttnDropout, ComputePath, Masking, fuses_projections, uses_blockwise
from numpy_attn.fast.projections import qkv_projections, qkv_weights, split_projection
from numpy_attn.spec import SPECS, LayerSpec
from numpy_attn.steps import Steps


def attend(
    fw: Any, queries: Any, keys: Any, values: Any, masking: Masking = Masking(),
    dropout: AttnDropout = AttnDropout(), path: ComputePath = ComputePath(), return_steps: bool = False,
) -> tuple[Any, Steps]:  # fmt: skip
    """Attention of queries over keys and values on ``path.implementation``'s path.

    Args: queries ``(..., T, H)``, keys ``(..., S, H)``, values ``(..., S, Hv)`` (the same leading
        axes); masking, dropout, path: what hides keys (the padding mask's B is the queries' first
        axis, 1 for ``(T, H)`` queries), dropout on the weights, how to compute; return_steps: also
        the ``(..., T, S)`` steps, from the reference math on either path (random dropout then
        draws one keep-mask that both use).
    Returns: ``(context_vec (..., T, Hv), steps)``; steps is empty without ``return_steps``.
    """
    blockwise = uses_blockwise(path.implementation, queries.shape[-2])
    random, keep_mask, steps = dropout.rng, dropout.keep_mask, Steps()
    if blockwise and return_steps and random is not None and dropout.rate:  # one draw for both paths
        keep_shape = (*queries.shape[:-1], keys.shape[-2])  # (..., T, S)
        keep_mask, random = fw.ops.draw_keep_mask(random, dropout.rate, keep_shape), None
    if not blockwise or return_steps:
        mask = fw.ops.causal_mask(queries.shape[-2], keys.shape[-2]) if masking.causal else None  # (T, S)
        if masking.padding_mask is not None:  # (B, S) -> (B, 1, ..., 1, S), the queries' rank
            padding = masking.padding_mask
            hidden_keys = padding.reshape(padding.shape[:1] + (1,) * (queries.ndim - 2) + padding.shape[1:])
            mask = hidden_keys if mask is None else mask | hidden_keys  # (B, 1, ..., T, S)
        context_vec, steps = fw.ops.scaled_dot_product_attention(
            queries, keys, values, mask, dropout=dropout.rate, attn_keep_mask=keep_mask, **{fw.random: random}
        )  # (..., T, Hv)
        if not blockwise:
            return context_vec, steps
    context_vec = fw.blockwise.blockwise_attention(
        queries, keys, values, causal=masking.causal, padding_mask=masking.padding_mask, dropout=dropout.rate,
        attn_keep_mask=keep_mask, block_size=path.block_size, **{fw.random: random},
    )  # fmt: skip
    return context_vec, steps


def attend_heads(
    fw: Any, x: Any, qkv: tuple[Any, Any], num_heads: int, masking: Masking = Masking(),
    dropout: AttnDropout = AttnDropout(), path: ComputePath = ComputePath(), return_steps: bool = False,
) -> tuple[Any, Steps]:  # fmt: skip
    """Multi-head self-attention up to the output projection: x projected by ``qkv`` (one matmul if
    ``path.fused_qkv``, else three), split into heads, ``attend``-ed, merged. On the blockwise path
    without steps each head is projected inside the loop (``blockwise_self_attention``).

    Args: x ``(B, T, D)``; qkv ``(weight (3E, D), bias (3E,) or None)``, torch's rows of W_query,
        W_key, W_value (note 003's ``Wqkv``); num_heads N, dividing E; the rest as ``attend``'s
        (the keep-mask ``(B, N, T, T)``).
    Returns: ``(context_vec (B, T, E), steps)``: with ``return_steps``, the projections
        ``queries``, ``keys``, ``values`` ``(B, T, E)`` and ``attend``'s steps.
    """
    if uses_blockwise(path.implementation, x.shape[-2]) and not return_steps:
        context_vec = fw.blockwise.blockwise_self_attention(
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
    spec: LayerSpec, fw: Any, params: Mapping[str, Any], x: Any, padding_mask: Any = None, *,
    implementation: str, block_size: int, return_steps: bool, **arguments: Any,
) -> tuple[Any, Steps]:  # fmt: skip
    """The layer of ``spec`` on the path ``implementation`` names: its projections, ``attend`` (or
    ``attend_heads``), its output projection and dropout; ``arguments`` are the layer's others
    (``num_heads``, rates, keep-masks, the random source). Returns ``(output, steps)`` as the
    layer's reference math, the ``(T, S)`` steps from it (only with ``return_steps``)."""
    random = arguments.get(fw.random)
    path = ComputePath(implementation, block_size, fuses_projections(implementation, x.shape[-2]))
    if spec.heads is not None:  # a stack of heads, each the layer spec.heads names
        return _stack(spec, fw, params, x, path, return_steps, random, arguments)
    attn_random, out_random = fw.split_random(random) if spec.out_dropout else (random, None)
    rate = arguments[spec.dropouts[0]] if spec.dropouts else None
    dropout = AttnDropout(rate, attn_random, arguments.get("attn_keep_mask"))
    masking = Masking(spec.causal, padding_mask)
    if spec.multi_head:
        qkv = _weights(params, "Wqkv") if spec.qkv == "fused" else qkv_weights(fw, params)  # (3E, D), (3E,)
        num_heads = arguments["num_heads"]
        context_vec, steps = attend_heads(fw, x, qkv, num_heads, masking, dropout, path, return_steps)
    else:
        if spec.qkv == "matrices":
            queries, keys, values = x @ params["W_query"], x @ params["W_key"], x @ params["W_value"]
        elif spec.qkv == "fused":
            queries, keys, values = split_projection(fw, x, *_weights(params, "Wqkv"))  # 3 x (..., T, E)
        else:
            queries, keys, values = qkv_projections(fw, x, params)  # 3 x (..., T, E)
        context_vec, steps = attend(fw, queries, keys, values, masking, dropout, path, return_steps)
        steps = Steps(queries=queries, keys=keys, values=values, **steps)
    steps = Steps(**steps, context_vec=context_vec)
    output = context_vec if spec.out is None else fw.ops.linear(context_vec, *_weights(params, spec.out))
    if spec.out_dropout is not None:
        steps["projected"] = output
        rate, keep_mask = arguments[spec.out_dropout], arguments.get("out_keep_mask")
        output = fw.ops.dropout(output, rate, keep_mask=keep_mask, **{fw.random: out_random})
    return output, Steps(**steps, output=output)


def _weights(params: Mapping[str, Any], name: str) -> tuple[Any, Any]:
    return params[f"{name}.weight"], params.get(f"{name}.bias")


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
