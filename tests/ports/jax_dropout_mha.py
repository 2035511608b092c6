"""A user's plain JAX port of the book's MultiHeadAttention with attention dropout (train mode)."""

import jax
import jax.numpy as jnp


def mha(params, x, key, num_heads=2, dropout=0.2):
    b, t, d = x.shape
    qkv = [x @ params[f"{n}.weight"].T + params[f"{n}.bias"] for n in ("W_query", "W_key", "W_value")]
    q, k, v = (y.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3) for y in qkv)
    scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(q.shape[-1])
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    keep = jax.random.bernoulli(key, 1.0 - dropout, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout), 0.0)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return context @ params["out_proj.weight"].T + params["out_proj.bias"]
