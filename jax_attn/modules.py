"""Flax NNX modules named as the torch classes of the notes.

Each holds its torch class's submodules under their attribute names (``nnx.Linear``, kernels
``(in, out)``; V1's raw ``(D, E)`` matrices; the wrapper's ``heads``), drawn as torch draws them,
and its ``__call__`` calls them around the one attention core (``AttentionModule._attend``): nothing
is converted or rebuilt per call; ``nnx.jit``, ``nnx.grad`` and ``nnx.vmap`` work. Constructors take
the torch constructor's arguments plus keyword-only ``dtype``, ``implementation``, ``block_size``
and ``rngs``; calls take ``return_steps`` and, with dropout, the notes' keep-masks (bool, True =
keep) and ``nnx.Dropout``'s ``deterministic`` and ``rngs``. Axis letters as in numpy_attn.
A bad argument or input raises the TypeError or ValueError of the layer's function, word for word.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jax_attn.module_base import AttentionModule, Rngs, torch_linear, torch_uniform
from jax_attn.ops import dropout as apply_dropout
from numpy_attn.fast.options import DEFAULT_BLOCK_SIZE, AttnDropout, Masking
from numpy_attn.steps import Steps

KeepMask = jax.Array | None  # bool, True = keep
Output = jax.Array | tuple[jax.Array, Steps]  # the output, or (output, steps) with return_steps
CAUSAL = Masking(causal=True)


def _qkv(d_in: int, d_out: int, bias: bool, dtype: Any, rngs: nnx.Rngs) -> list[nnx.Linear]:
    """``W_query``, ``W_key``, ``W_value``: the three ``nn.Linear(d_in, d_out)``."""
    return [torch_linear(d_in, d_out, bias, dtype, rngs) for _ in range(3)]


class SelfAttentionV1(AttentionModule):
    """Raw matrices ``W_query``, ``W_key``, ``W_value`` ``(D, E)`` used as ``x @ W``, drawn from
    U[0, 1) as ``torch.rand``. Call: x ``(T, D)`` -> ``(T, E)``."""

    layer = "SelfAttentionV1"

    def __init__(
        self, d_in: int, d_out: int,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self._init_layer(locals())
        draw = torch_uniform(0.0, 1.0)  # torch.rand
        self.W_query, self.W_key, self.W_value = (
            nnx.Param(draw(rngs.params(), (d_in, d_out), dtype)) for _ in range(3)
        )

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        x = self._check_call(x, return_steps)
        queries, keys, values = (x @ w[...] for w in (self.W_query, self.W_key, self.W_value))  # 3 x (T, E)
        context_vec, steps = self._attend(queries, keys, values, return_steps=return_steps)  # (T, E)
        return self._finish(context_vec, steps, return_steps)


class SelfAttentionV2(AttentionModule):
    """``nn.Linear`` projections (biased with ``qkv_bias``). Call: x ``(T, D)`` -> ``(T, E)``."""

    layer = "SelfAttentionV2"

    def __init__(
        self, d_in: int, d_out: int, qkv_bias: bool = False,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self._init_layer(locals())
        self.W_query, self.W_key, self.W_value = _qkv(d_in, d_out, qkv_bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        x = self._check_call(x, return_steps)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # 3 x (T, E)
        context_vec, steps = self._attend(queries, keys, values, return_steps=return_steps)  # (T, E)
        return self._finish(context_vec, steps, return_steps)


class CausalAttention(AttentionModule):
    """One causal head, dropout on the attention weights. Call: x ``(B, T, D)``, T <= context_length
    -> ``(B, T, E)``; ``attn_keep_mask`` bool ``(B, T, S)`` replaces the random draw."""

    layer = "CausalAttention"

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self._init_layer(locals())
        self.W_query, self.W_key, self.W_value = _qkv(d_in, d_out, qkv_bias, dtype, rngs)

    def __call__(
        self, x: jax.Array, *, attn_keep_mask: KeepMask = None, deterministic: bool | None = None,
        rngs: Rngs = None, return_steps: bool = False,
    ) -> Output:  # fmt: skip
        x = self._check_call(x, return_steps, attn_keep_mask=attn_keep_mask)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # 3 x (B, T, E)
        dropout = AttnDropout(self.dropout, self._dropout_key(deterministic, rngs), attn_keep_mask)
        context_vec, steps = self._attend(queries, keys, values, CAUSAL, dropout, return_steps=return_steps)
        return self._finish(context_vec, steps, return_steps)  # (B, T, E)


class MultiHeadAttentionWrapper(AttentionModule):
    """``heads``: an ``nnx.List`` of ``CausalAttention``, outputs concatenated. Call: x ``(B, T, D)``
    -> ``(B, T, N * E)``; ``attn_keep_mask`` bool ``(B, N, T, S)``, head i gets ``[:, i]``. The
    wrapper's train/eval state and dropout stream drive every head."""

    layer = "MultiHeadAttentionWrapper"

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
        qkv_bias: bool = False, *, dtype: Any = jnp.float32, implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE, rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self._init_layer(locals())
        options = {"dtype": dtype, "implementation": implementation, "block_size": block_size, "rngs": rngs}
        self.heads = nnx.List([CausalAttention(d_in, d_out, context_length, dropout, qkv_bias, **options)
                               for _ in range(num_heads)])  # fmt: skip
        for head in self.heads:
            head._init_dropout(None)  # the wrapper's stream drives them

    def __call__(
        self, x: jax.Array, *, attn_keep_mask: KeepMask = None, deterministic: bool | None = None,
        rngs: Rngs = None, return_steps: bool = False,
    ) -> Output:  # fmt: skip
        x = self._check_call(x, return_steps, attn_keep_mask=attn_keep_mask)
        stream = self._dropout_rngs(deterministic, rngs)
        head_outputs, head_steps = [], Steps()
        for i, head in enumerate(self.heads):
            result = head(x, attn_keep_mask=None if attn_keep_mask is None else attn_keep_mask[:, i],
                          deterministic=stream is None, rngs=stream, return_steps=return_steps)  # fmt: skip
            head_output, steps = result if return_steps else (result, Steps())  # (B, T, E)
            head_outputs.append(head_output)
            head_steps.update((f"heads.{i}.{name}", value) for name, value in steps.items())
        context_vec = jnp.concatenate(head_outputs, axis=-1)  # (B, T, N * E)
        return self._finish(context_vec, Steps(context_vec=context_vec), return_steps, sown=head_steps)


class MultiHeadAttention(AttentionModule):
    """The book's class (``out_bias=True``) or note 004's (``out_bias=qkv_bias``): causal heads
    split from the projections, merged, then ``out_proj``. Call: x ``(B, T, D)``, T <=
    context_length -> ``(B, T, E)``; ``attn_keep_mask`` bool ``(B, N, T, S)``."""

    layer = "MultiHeadAttention"

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
        qkv_bias: bool = False, out_bias: bool = True,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self._init_layer(locals())
        self.W_query, self.W_key, self.W_value = _qkv(d_in, d_out, qkv_bias, dtype, rngs)
        self.out_proj = torch_linear(d_out, d_out, out_bias, dtype, rngs)

    def __call__(
        self, x: jax.Array, *, attn_keep_mask: KeepMask = None, deterministic: bool | None = None,
        rngs: Rngs = None, return_steps: bool = False,
    ) -> Output:  # fmt: skip
        x = self._check_call(x, return_steps, attn_keep_mask=attn_keep_mask)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # 3 x (B, T, E)
        dropout = AttnDropout(self.dropout, self._dropout_key(deterministic, rngs), attn_keep_mask)
        context_vec, steps = self._attend(queries, keys, values, CAUSAL, dropout, num_heads=self.num_heads,
                                          return_steps=return_steps)  # fmt: skip
        return self._finish(self.out_proj(context_vec), steps, return_steps)  # (B, T, E)


class FusedSingleHeadAttention(AttentionModule):
    """Note 003's ``SingleHeadAttention``: ``Wqkv`` projects to one bidirectional head of size
    ``hidden_size // 4``, ``Wo`` back. Call: x ``(B, T, D)`` -> ``(B, T, D)``."""

    layer = "FusedSingleHeadAttention"

    def __init__(
        self, hidden_size: int, bias: bool = True,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self._init_layer(locals())
        self.Wqkv = torch_linear(hidden_size, (hidden_size // 4) * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size // 4, hidden_size, bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        x = self._check_call(x, return_steps)
        queries, keys, values = jnp.split(self.Wqkv(x), 3, axis=-1)  # 3 x (B, T, E)
        context_vec, steps = self._attend(queries, keys, values, return_steps=return_steps)  # (B, T, E)
        return self._finish(self.Wo(context_vec), steps, return_steps)  # (B, T, D)


class FusedMultiHeadAttention(AttentionModule):
    """Note 003's bidirectional ``MultiHeadAttention``: ``Wqkv(x)`` cut into thirds and heads (the
    notes' ``reshape(B, T, 3, N, H).transpose(3, 1).unbind(2)``), then ``Wo``. Call: x ``(B, T, D)``
    -> ``(B, T, D)``."""

    layer = "FusedMultiHeadAttention"

    def __init__(
        self, hidden_size: int, num_heads: int, bias: bool = True,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self._init_layer(locals())
        self.Wqkv = torch_linear(hidden_size, hidden_size * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size, hidden_size, bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        x = self._check_call(x, return_steps)
        queries, keys, values = jnp.split(self.Wqkv(x), 3, axis=-1)  # 3 x (B, T, D)
        context_vec, steps = self._attend(
            queries, keys, values, num_heads=self.num_heads, return_steps=return_steps
        )
        return self._finish(self.Wo(context_vec), steps, return_steps)  # (B, T, D)


class FusedCausalAttention(AttentionModule):
    """Note 003's ``CausalAttention``: fused causal heads, a padding mask, dropout on the attention
    weights (``attn_drop``, the key's first half) and on the output (``out_drop``, its second).

    Call: ``module(x, padding_mask)``: x ``(B, T, D)``, T <= context_size; ``padding_mask`` bool
    ``(B, S)``, True = padding, or None; keep-masks ``attn_keep_mask`` ``(B, N, T, S)`` and
    ``out_keep_mask`` ``(B, T, D)``. Returns ``(B, T, D)``; its steps end with ``projected``, ``output``.
    """

    layer = "FusedCausalAttention"

    def __init__(
        self, hidden_size: int, num_heads: int, context_size: int, attn_drop: float = 0.1,
        out_drop: float = 0.1, bias: bool = True,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self._init_layer(locals())
        self.Wqkv = torch_linear(hidden_size, hidden_size * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size, hidden_size, bias, dtype, rngs)

    def __call__(
        self, x: jax.Array, padding_mask: jax.Array | None = None, *, attn_keep_mask: KeepMask = None,
        out_keep_mask: KeepMask = None, deterministic: bool | None = None, rngs: Rngs = None,
        return_steps: bool = False,
    ) -> Output:  # fmt: skip
        x = self._check_call(x, return_steps, padding_mask=padding_mask, attn_keep_mask=attn_keep_mask,
                             out_keep_mask=out_keep_mask)  # fmt: skip
        key = self._dropout_key(deterministic, rngs)
        attn_key, out_key = (None, None) if key is None else jax.random.split(key)
        queries, keys, values = jnp.split(self.Wqkv(x), 3, axis=-1)  # 3 x (B, T, D)
        masking, dropout = Masking(True, padding_mask), AttnDropout(self.attn_drop, attn_key, attn_keep_mask)
        context_vec, steps = self._attend(queries, keys, values, masking, dropout, num_heads=self.num_heads,
                                          return_steps=return_steps)  # fmt: skip
        projected = self.Wo(context_vec)  # (B, T, D)
        output = apply_dropout(projected, self.out_drop, key=out_key, keep_mask=out_keep_mask)  # (B, T, D)
        return self._finish(output, Steps(**steps, projected=projected), return_steps)
