"""A user's plain JAX port of the book's MultiHeadAttention."""

import jax
import jax.numpy as jnp


def linear(params, name, x):
    return x @ params[f"{name}.weight"].T + params[f"{name}.bias"]


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    queries = linear(params, "W_query", x)
    keys = linear(params, "W_key", x)
    values = linear(params, "W_value", x)
    head_dim = queries.shape[-1] // num_heads
    queries = queries.reshape(b, t, num_heads, head_dim).swapaxes(1, 2)
    keys = keys.reshape(b, t, num_heads, head_dim).swapaxes(1, 2)
    values = values.reshape(b, t, num_heads, head_dim).swapaxes(1, 2)
    attn_scores = queries @ keys.swapaxes(-1, -2)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    attn_scores = jnp.where(causal, attn_scores, -jnp.inf)
    attn_weights = jax.nn.softmax(attn_scores / jnp.sqrt(head_dim), axis=-1)
    context = attn_weights @ values
    context = context.swapaxes(1, 2).reshape(b, t, num_heads * head_dim)
    return linear(params, "out_proj", context)
