"""A user's Flax linen transformer block: attention for one head and one sequence, batched over
heads and then over the batch by nested ``jax.vmap``; a long-sequence path computing the queries
chunk by chunk in a ``jax.lax.scan``. The weights are a linen params tree (``Dense`` kernels
(in, out), ``LayerNorm`` scale and bias)."""

import jax
import jax.numpy as jnp
from flax import linen as nn


def one_head(q, k, v):
    """(T, H) each -> (T, H): causal attention of one head of one sequence."""
    t, h = q.shape
    scores = q @ k.T / jnp.sqrt(h)  # (T, S)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1) @ v


def chunked_head(q, k, v, chunk):
    """The same, ``chunk`` queries at a time: (T, H) each -> (T, H)."""
    t, h = q.shape
    starts = jnp.arange(0, t, chunk)

    def step(carry, start):
        rows = jax.lax.dynamic_slice_in_dim(q, start, chunk)  # (C, H)
        scores = rows @ k.T / jnp.sqrt(h)  # (C, S)
        visible = (start + jnp.arange(chunk))[:, None] >= jnp.arange(t)[None, :]
        scores = jnp.where(visible, scores, -jnp.inf)
        return carry, jax.nn.softmax(scores, axis=-1) @ v

    _, out = jax.lax.scan(step, None, starts)  # (T / C, C, H)
    return out.reshape(t, h)


class Block(nn.Module):
    num_heads: int
    chunk: int = 0  # 0: all queries at once

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        h = d // self.num_heads
        y = nn.LayerNorm(epsilon=1e-5, name="ln_1")(x)
        qkv = nn.Dense(3 * d, name="c_attn")(y)
        q, k, v = (m.reshape(b, t, self.num_heads, h) for m in jnp.split(qkv, 3, axis=-1))
        head = one_head if not self.chunk else lambda q, k, v: chunked_head(q, k, v, self.chunk)
        per_sequence = jax.vmap(head, in_axes=(1, 1, 1), out_axes=1)  # over the heads: (T, N, H)
        context = jax.vmap(per_sequence)(q, k, v)  # over the batch: (B, T, N, H)
        x = x + nn.Dense(d, name="attn_proj")(context.reshape(b, t, d))
        y = nn.LayerNorm(epsilon=1e-5, name="ln_2")(x)
        y = nn.gelu(nn.Dense(4 * d, name="c_fc")(y), approximate=True)
        return x + nn.Dense(d, name="mlp_proj")(y)
