"""Step traces: the named intermediate arrays that every layer can return.

Every layer function (and every torch_ref / jax_attn layer) takes ``return_steps=False``; with
True it returns ``(output, steps)`` where ``steps`` is an ``OrderedDict`` (a plain dict would lose
its order under ``jax.jit``) from step name to array. The names and shapes are the same in every
framework. ``STEP_DOCS`` below is the one place where they are defined; multi-head classes have
the N axis, single-head classes (V1, V2, CausalAttention, FusedSingleHeadAttention) drop it, and
V1/V2 also drop B. The wrapper records each head's steps under ``heads.{i}.``.
"""

from __future__ import annotations

from collections import OrderedDict

Steps = OrderedDict  # OrderedDict[str, array]

STEP_DOCS: dict[str, str] = {
    "queries": "(B, T, E) projection output before any head split (fused: 1st third of Wqkv(x))",
    "keys": "(B, S, E) projection output before any head split (fused: 2nd third of Wqkv(x))",
    "values": "(B, S, E) projection output before any head split (fused: last third of Wqkv(x))",
    "attn_scores": "(B, N, T, S) raw queries @ keys^T per head: before masking and scaling",
    "masked_scores": "(B, N, T, S) attn_scores with -inf where the mask hides a key (masked classes)",
    "attn_weights": "(B, N, T, S) softmax(masked_scores / sqrt(H)) over S, before dropout",
    "attn_weights_dropped": "(B, N, T, S) attn_weights after dropout (classes with dropout)",
    "context_vec": "(B, T, E) attn_weights_dropped @ values, heads merged, before out projection",
    "projected": "(B, T, D) Wo(context_vec) before output dropout (FusedCausalAttention only)",
    "output": "the layer's return value",
}
