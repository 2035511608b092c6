"""Flax NNX modules named like the torch classes.

Each holds its weights as ``nnx.Param``s in Flax's layout inside the submodules the torch class
has (``nnx.Linear`` kernels are ``(in, out)``; ``heads`` is an ``nnx.List`` of
``CausalAttention``), and its ``__call__`` calls them: ``queries = self.W_query(x)``..., then
``jax_attn.attend`` (through ``AttentionModule._attention``), then the output projection. Nothing
is converted, copied to the host or rebuilt per call; the modules work under ``nnx.jit``,
``nnx.grad`` and ``nnx.vmap``. Constructors take the torch constructors' arguments (plus
keyword-only ``dtype``, ``implementation``, ``block_size`` and ``rngs``); ``from_params`` builds
a module from the project's weights format (or a torch ``state_dict()``) and ``to_params`` gives
it back (``jax_attn.convert`` is the one place where torch's layout becomes Flax's). Calls take
``return_steps`` (see ``AttentionModule`` for the steps they sow) and, with dropout, the
keep-masks of the notes (True = keep) and ``nnx.Dropout``'s ``deterministic`` and ``rngs``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from numpy_attn.attend_options import AttnDropout, Masking

from jax_attn.blockwise import DEFAULT_BLOCK_SIZE
from jax_attn.dropout import dropout as apply_dropout
from jax_attn.module_base import AttentionModule, torch_linear, torch_qkv, torch_uniform
from numpy_attn.steps import Steps

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

Rngs = nnx.Rngs | nnx.RngStream | None
KeepMask = jax.Array | None  # bool, True = keep
Output = jax.Array | tuple[jax.Array, Steps]


class SelfAttentionV1(AttentionModule):
    """Raw ``(d_in, d_out)`` matrices used as ``x @ W``, initialised uniform in [0, 1) like
    ``torch.rand``. x is ``(T, D)``; returns ``(T, E)``."""

    layer = "SelfAttentionV1"

    def __init__(
        self, d_in: int, d_out: int,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        self._init_layer({"d_in": d_in, "d_out": d_out}, dtype, implementation, block_size, rngs)
        init = torch_uniform(0.0, 1.0)
        self.W_query = nnx.Param(init(rngs.params(), (d_in, d_out), dtype))
        self.W_key = nnx.Param(init(rngs.params(), (d_in, d_out), dtype))
        self.W_value = nnx.Param(init(rngs.params(), (d_in, d_out), dtype))

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        x = self._check_call(x, return_steps=return_steps)
        queries = x @ self.W_query[...]  # (T, E)
        keys = x @ self.W_key[...]  # (T, E)
        values = x @ self.W_value[...]  # (T, E)
        context_vec, steps = self._attention(queries, keys, values, return_steps=return_steps)  # (T, E)
        return self._finish(context_vec, steps, return_steps)


class SelfAttentionV2(AttentionModule):
    """``nn.Linear`` projections. x is ``(T, D)``; returns ``(T, E)``."""

    layer = "SelfAttentionV2"

    def __init__(
        self, d_in: int, d_out: int, qkv_bias: bool = False,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        arguments = {"d_in": d_in, "d_out": d_out, "qkv_bias": qkv_bias}
        self._init_layer(arguments, dtype, implementation, block_size, rngs)
        self.W_query, self.W_key, self.W_value = torch_qkv(d_in, d_out, qkv_bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        x = self._check_call(x, return_steps=return_steps)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # 3 x (T, E)
        context_vec, steps = self._attention(queries, keys, values, return_steps=return_steps)  # (T, E)
        return self._finish(context_vec, steps, return_steps)


class CausalAttention(AttentionModule):
    """One causal head with dropout on the attention weights. x is ``(B, T, D)`` with
    T <= context_length; returns ``(B, T, E)``. ``attn_keep_mask`` (bool ``(B, T, S)``,
    True = keep) replaces the random draw."""

    layer = "CausalAttention"

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        arguments = {"d_in": d_in, "d_out": d_out, "context_length": context_length, "dropout": dropout}
        self._init_layer(arguments | {"qkv_bias": qkv_bias}, dtype, implementation, block_size, rngs)
        self.W_query, self.W_key, self.W_value = torch_qkv(d_in, d_out, qkv_bias, dtype, rngs)

    def __call__(
        self, x: jax.Array,
        *, attn_keep_mask: KeepMask = None, deterministic: bool | None = None, rngs: Rngs = None,
        return_steps: bool = False,
    ) -> Output:  # fmt: skip
        x = self._check_call(x, return_steps=return_steps, attn_keep_mask=attn_keep_mask)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # 3 x (B, T, E)
        dropout = AttnDropout(self.dropout, self._dropout_key(deterministic, rngs), attn_keep_mask)
        context_vec, steps = self._attention(
            queries, keys, values, Masking(causal=True), dropout, return_steps=return_steps
        )  # (B, T, E)
        return self._finish(context_vec, steps, return_steps)


class MultiHeadAttentionWrapper(AttentionModule):
    """``heads`` is an ``nnx.List`` of ``CausalAttention`` modules (weights ``heads.{i}.*``),
    each called in turn, outputs concatenated: x ``(B, T, D)`` gives ``(B, T, N * E)``.
    ``attn_keep_mask`` is bool ``(B, N, T, S)``, True = keep (head i gets ``[:, i]``). The
    wrapper's train/eval state and dropout stream drive every head."""

    layer = "MultiHeadAttentionWrapper"

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
        qkv_bias: bool = False,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        arguments = {"d_in": d_in, "d_out": d_out, "context_length": context_length, "dropout": dropout}
        arguments |= {"num_heads": num_heads, "qkv_bias": qkv_bias}
        self._init_layer(arguments, dtype, implementation, block_size, rngs)
        options = {"dtype": dtype, "implementation": implementation, "block_size": block_size, "rngs": rngs}
        head_arguments = (d_in, d_out, context_length, dropout, qkv_bias)
        self.heads = nnx.List([CausalAttention(*head_arguments, **options) for _ in range(num_heads)])
        for head in self.heads:
            head._init_dropout(None)  # the wrapper's own dropout stream drives every head

    def __call__(
        self, x: jax.Array,
        *, attn_keep_mask: KeepMask = None, deterministic: bool | None = None, rngs: Rngs = None,
        return_steps: bool = False,
    ) -> Output:  # fmt: skip
        x = self._check_call(x, return_steps=return_steps, attn_keep_mask=attn_keep_mask)
        stream = self._dropout_rngs(deterministic, rngs)
        head_outputs, head_steps = [], Steps()
        for i, head in enumerate(self.heads):
            result = head(
                x, attn_keep_mask=None if attn_keep_mask is None else attn_keep_mask[:, i],
                deterministic=stream is None, rngs=stream, return_steps=return_steps,
            )  # fmt: skip
            head_output, steps = result if return_steps else (result, Steps())  # (B, T, E)
            head_outputs.append(head_output)
            head_steps.update((f"heads.{i}.{name}", value) for name, value in steps.items())
        context_vec = jnp.concatenate(head_outputs, axis=-1)  # (B, T, N * E)
        return self._finish(context_vec, Steps(context_vec=context_vec), return_steps, sown=head_steps)


class MultiHeadAttention(AttentionModule):
    """The book's class (``out_bias=True``) or note 004's (``out_bias=qkv_bias``): causal
    multi-head attention, x ``(B, T, D)`` with T <= context_length gives ``(B, T, E)``.
    ``attn_keep_mask`` is bool ``(B, N, T, S)``, True = keep."""

    layer = "MultiHeadAttention"

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
        qkv_bias: bool = False, out_bias: bool = True,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        arguments = {"d_in": d_in, "d_out": d_out, "context_length": context_length, "dropout": dropout}
        arguments |= {"num_heads": num_heads, "qkv_bias": qkv_bias, "out_bias": out_bias}
        self._init_layer(arguments, dtype, implementation, block_size, rngs)
        self.W_query, self.W_key, self.W_value = torch_qkv(d_in, d_out, qkv_bias, dtype, rngs)
        self.out_proj = torch_linear(d_out, d_out, out_bias, dtype, rngs)

    def __call__(
        self, x: jax.Array,
        *, attn_keep_mask: KeepMask = None, deterministic: bool | None = None, rngs: Rngs = None,
        return_steps: bool = False,
    ) -> Output:  # fmt: skip
        x = self._check_call(x, return_steps=return_steps, attn_keep_mask=attn_keep_mask)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # 3 x (B, T, E)
        context_vec, steps = self._attention(
            queries, keys, values, Masking(causal=True),
            AttnDropout(self.dropout, self._dropout_key(deterministic, rngs), attn_keep_mask),
            num_heads=self.num_heads, return_steps=return_steps,
        )  # fmt: skip  # (B, T, E)
        output = self.out_proj(context_vec)  # (B, T, E)
        return self._finish(output, steps, return_steps)


class FusedSingleHeadAttention(AttentionModule):
    """Note 003's ``SingleHeadAttention``: one fused ``Wqkv`` projection, head size
    ``hidden_size // 4``, bidirectional. x ``(B, T, D)`` gives ``(B, T, D)``."""

    layer = "FusedSingleHeadAttention"

    def __init__(
        self, hidden_size: int, bias: bool = True,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        self._init_layer({"hidden_size": hidden_size, "bias": bias}, dtype, implementation, block_size, rngs)
        self.Wqkv = torch_linear(hidden_size, (hidden_size // 4) * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size // 4, hidden_size, bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        x = self._check_call(x, return_steps=return_steps)
        queries, keys, values = jnp.split(self.Wqkv(x), 3, axis=-1)  # 3 x (B, T, E)
        context_vec, steps = self._attention(queries, keys, values, return_steps=return_steps)  # (B, T, E)
        output = self.Wo(context_vec)  # (B, T, D)
        return self._finish(output, steps, return_steps)


class FusedMultiHeadAttention(AttentionModule):
    """Note 003's bidirectional ``MultiHeadAttention``: ``Wqkv(x)`` split into thirds and heads
    (the notes' ``reshape(B, T, 3, N, H).transpose(3, 1).unbind(2)``). x ``(B, T, D)`` gives
    ``(B, T, D)``."""

    layer = "FusedMultiHeadAttention"

    def __init__(
        self, hidden_size: int, num_heads: int, bias: bool = True,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        arguments = {"hidden_size": hidden_size, "num_heads": num_heads, "bias": bias}
        self._init_layer(arguments, dtype, implementation, block_size, rngs)
        self.Wqkv = torch_linear(hidden_size, hidden_size * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size, hidden_size, bias, dtype, rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        x = self._check_call(x, return_steps=return_steps)
        queries, keys, values = jnp.split(self.Wqkv(x), 3, axis=-1)  # 3 x (B, T, D)
        context_vec, steps = self._attention(
            queries, keys, values, num_heads=self.num_heads, return_steps=return_steps
        )  # (B, T, D)
        output = self.Wo(context_vec)  # (B, T, D)
        return self._finish(output, steps, return_steps)


class FusedCausalAttention(AttentionModule):
    """Note 003's ``CausalAttention``: call as ``module(x, padding_mask)``, ``padding_mask``
    bool ``(B, S)``, True = padding (None: no padding). Dropout on the attention weights
    (``attn_drop``) and on the output (``out_drop``); keep-masks ``attn_keep_mask`` bool
    ``(B, N, T, S)`` and ``out_keep_mask`` bool ``(B, T, D)``, True = keep. x ``(B, T, D)``
    with T <= context_size gives ``(B, T, D)``; steps end with ``projected`` and ``output``."""

    layer = "FusedCausalAttention"

    def __init__(
        self, hidden_size: int, num_heads: int, context_size: int, attn_drop: float = 0.1,
        out_drop: float = 0.1, bias: bool = True,
        *, dtype: Any = jnp.float32, implementation: str = "reference", block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        arguments = {"hidden_size": hidden_size, "num_heads": num_heads, "context_size": context_size}
        arguments |= {"attn_drop": attn_drop, "out_drop": out_drop, "bias": bias}
        self._init_layer(arguments, dtype, implementation, block_size, rngs)
        self.Wqkv = torch_linear(hidden_size, hidden_size * 3, bias, dtype, rngs)
        self.Wo = torch_linear(hidden_size, hidden_size, bias, dtype, rngs)

    def __call__(
        self, x: jax.Array, padding_mask: jax.Array | None = None,
        *, attn_keep_mask: KeepMask = None, out_keep_mask: KeepMask = None, deterministic: bool | None = None,
        rngs: Rngs = None, return_steps: bool = False,
    ) -> Output:  # fmt: skip
        x = self._check_call(
            x, return_steps=return_steps, attn_keep_mask=attn_keep_mask, out_keep_mask=out_keep_mask,
            padding_mask=padding_mask,
        )  # fmt: skip
        key = self._dropout_key(deterministic, rngs)
        attn_key, out_key = (None, None) if key is None else jax.random.split(key)
        queries, keys, values = jnp.split(self.Wqkv(x), 3, axis=-1)  # 3 x (B, T, D)
        context_vec, steps = self._attention(
            queries, keys, values,
            Masking(causal=True, padding_mask=padding_mask),
            AttnDropout(self.attn_drop, attn_key, attn_keep_mask),
            num_heads=self.num_heads, return_steps=return_steps,
        )  # fmt: skip  # (B, T, D)
        projected = self.Wo(context_vec)  # (B, T, D)
        output = apply_dropout(projected, self.out_drop, key=out_key, keep_mask=out_keep_mask)
        steps["projected"] = projected  # the last step before output dropout
        return self._finish(output, steps, return_steps)
