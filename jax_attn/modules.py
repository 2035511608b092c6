"""Flax NNX modules named like the torch classes; each holds ``nnx.Param``s and calls the
jax_attn function of the same math. Constructors take the torch constructors' arguments (plus
``dtype``, ``implementation``, ``block_size`` and ``rngs``); ``from_params`` (one, in
``AttentionModule``) builds a module from the project's weights format and ``to_params`` gives
it back. The weights live in Flax layout (``nnx.Linear`` kernels are
``(in, out)``); ``jax_attn.convert`` is the one place where torch's layout becomes Flax's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jax_attn.blockwise import DEFAULT_BLOCK_SIZE
from jax_attn.causal import causal_attention, multi_head_attention_wrapper
from jax_attn.fused import fused_causal_attention, fused_multi_head_attention, fused_single_head_attention
from jax_attn.module_base import AttentionModule, torch_linear, torch_uniform
from jax_attn.multi_head import multi_head_attention
from jax_attn.self_attention import self_attention_v1, self_attention_v2

__all__ = [
    "CausalAttention",
    "FusedCausalAttention",
    "FusedMultiHeadAttention",
    "FusedSingleHeadAttention",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "SelfAttentionV1",
    "SelfAttentionV2",
]


class SelfAttentionV1(AttentionModule):
    """Raw ``(d_in, d_out)`` matrices, initialised uniform in [0, 1) like ``torch.rand``."""

    layer = "SelfAttentionV1"

    def __init__(
        self,
        d_in: int,
        d_out: int,
        *,
        dtype: Any = jnp.float32,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):
        self.implementation, self.block_size = implementation, block_size
        init = torch_uniform(0.0, 1.0)
        self.W_query = nnx.Param(init(rngs.params(), (d_in, d_out), dtype))
        self.W_key = nnx.Param(init(rngs.params(), (d_in, d_out), dtype))
        self.W_value = nnx.Param(init(rngs.params(), (d_in, d_out), dtype))

    def __call__(self, x: jax.Array, *, return_steps: bool = False):
        return self_attention_v1(
            self.torch_params(),
            x,
            implementation=self.implementation,
            block_size=self.block_size,
            return_steps=return_steps,
        )


class SelfAttentionV2(AttentionModule):
    layer = "SelfAttentionV2"

    def __init__(
        self,
        d_in: int,
        d_out: int,
        qkv_bias: bool = False,
        *,
        dtype: Any = jnp.float32,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):
        self.implementation, self.block_size = implementation, block_size
        self.W_query = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)
        self.W_key = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)
        self.W_value = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False):
        return self_attention_v2(
            self.torch_params(),
            x,
            implementation=self.implementation,
            block_size=self.block_size,
            return_steps=return_steps,
        )


class CausalAttention(AttentionModule):
    layer = "CausalAttention"

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        qkv_bias: bool = False,
        *,
        dtype: Any = jnp.float32,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):
        self.implementation, self.block_size = implementation, block_size
        self.context_length = context_length
        self.dropout = dropout
        self.W_query = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)
        self.W_key = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)
        self.W_value = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)
        self._init_dropout(rngs)

    def __call__(self, x: jax.Array, *, attn_keep_mask: jax.Array | None = None, return_steps: bool = False):
        return causal_attention(
            self.torch_params(),
            x,
            context_length=self.context_length,
            dropout=self.dropout,
            key=self.dropout_key(),
            attn_keep_mask=attn_keep_mask,
            implementation=self.implementation,
            block_size=self.block_size,
            return_steps=return_steps,
        )


class MultiHeadAttentionWrapper(AttentionModule):
    """``heads`` is an ``nnx.List`` of ``CausalAttention`` modules (weights ``heads.{i}.*``);
    the wrapper's own train/eval state and dropout stream drive all heads."""

    layer = "MultiHeadAttentionWrapper"

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        *,
        dtype: Any = jnp.float32,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):
        self.implementation, self.block_size = implementation, block_size
        self.context_length = context_length
        self.dropout = dropout
        self.num_heads = num_heads
        self.heads = nnx.List(
            [
                CausalAttention(d_in, d_out, context_length, dropout, qkv_bias, dtype=dtype, rngs=rngs)
                for _ in range(num_heads)
            ]
        )
        for head in self.heads:
            head._init_dropout(None)  # the wrapper's own dropout stream drives every head
        self._init_dropout(rngs)

    def __call__(self, x: jax.Array, *, attn_keep_mask: jax.Array | None = None, return_steps: bool = False):
        return multi_head_attention_wrapper(
            self.torch_params(),
            x,
            num_heads=self.num_heads,
            context_length=self.context_length,
            dropout=self.dropout,
            key=self.dropout_key(),
            attn_keep_mask=attn_keep_mask,
            implementation=self.implementation,
            block_size=self.block_size,
            return_steps=return_steps,
        )


class MultiHeadAttention(AttentionModule):
    """The book's class (``out_bias=True``) or note 004's (``out_bias=qkv_bias``)."""

    layer = "MultiHeadAttention"

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        out_bias: bool = True,
        *,
        dtype: Any = jnp.float32,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):
        self.implementation, self.block_size = implementation, block_size
        self.context_length = context_length
        self.dropout = dropout
        self.num_heads = num_heads
        self.W_query = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)
        self.W_key = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)
        self.W_value = torch_linear(d_in, d_out, qkv_bias, dtype, rngs)
        self.out_proj = torch_linear(d_out, d_out, out_bias, dtype, rngs)
        self._init_dropout(rngs)

    def __call__(self, x: jax.Array, *, attn_keep_mask: jax.Array | None = None, return_steps: bool = False):
        return multi_head_attention(
            self.torch_params(),
            x,
            num_heads=self.num_heads,
            context_length=self.context_length,
            dropout=self.dropout,
            key=self.dropout_key(),
            attn_keep_mask=attn_keep_mask,
            implementation=self.implementation,
            block_size=self.block_size,
            return_steps=return_steps,
        )


class FusedSingleHeadAttention(AttentionModule):
    layer = "FusedSingleHeadAttention"

    def __init__(
        self,
        hidden_size: int,
        bias: bool = True,
        *,
        dtype: Any = jnp.float32,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):
        self.implementation, self.block_size = implementation, block_size
        self.Wqkv = torch_linear(hidden_size, (hidden_size // 4) * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size // 4, hidden_size, bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False):
        return fused_single_head_attention(
            self.torch_params(),
            x,
            implementation=self.implementation,
            block_size=self.block_size,
            return_steps=return_steps,
        )


class FusedMultiHeadAttention(AttentionModule):
    layer = "FusedMultiHeadAttention"

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        bias: bool = True,
        *,
        dtype: Any = jnp.float32,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):
        self.implementation, self.block_size = implementation, block_size
        self.num_heads = num_heads
        self.Wqkv = torch_linear(hidden_size, hidden_size * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size, hidden_size, bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False):
        return fused_multi_head_attention(
            self.torch_params(),
            x,
            num_heads=self.num_heads,
            implementation=self.implementation,
            block_size=self.block_size,
            return_steps=return_steps,
        )


class FusedCausalAttention(AttentionModule):
    """Call as ``module(x, padding_mask)``; ``padding_mask`` bool ``(B, S)``, True = padding."""

    layer = "FusedCausalAttention"

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        context_size: int,
        attn_drop: float = 0.1,
        out_drop: float = 0.1,
        bias: bool = True,
        *,
        dtype: Any = jnp.float32,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):
        self.implementation, self.block_size = implementation, block_size
        self.num_heads = num_heads
        self.context_size = context_size
        self.attn_drop = attn_drop
        self.out_drop = out_drop
        self.Wqkv = torch_linear(hidden_size, hidden_size * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size, hidden_size, bias, dtype, rngs)
        self._init_dropout(rngs)

    def __call__(
        self,
        x: jax.Array,
        padding_mask: jax.Array | None = None,
        *,
        attn_keep_mask: jax.Array | None = None,
        out_keep_mask: jax.Array | None = None,
        return_steps: bool = False,
    ):
        return fused_causal_attention(
            self.torch_params(),
            x,
            padding_mask,
            num_heads=self.num_heads,
            context_size=self.context_size,
            attn_drop=self.attn_drop,
            out_drop=self.out_drop,
            key=self.dropout_key(),
            attn_keep_mask=attn_keep_mask,
            out_keep_mask=out_keep_mask,
            implementation=self.implementation,
            block_size=self.block_size,
            return_steps=return_steps,
        )
