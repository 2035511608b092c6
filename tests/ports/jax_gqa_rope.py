"""A user's JAX port of grouped-query attention with rotary position embeddings, the rotation
written with the halves of each head and the key/value heads repeated for their query heads."""

import jax
import jax.numpy as jnp


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def norm(x, weight, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * weight


def attention(params, x, n_heads=4, n_kv=2):
    batch, seq, _ = x.shape
    head_dim = params["att.W_query.weight"].shape[0] // n_heads
    queries = jnp.einsum("btd,ed->bte", x, params["att.W_query.weight"])
    keys = jnp.einsum("btd,ed->bte", x, params["att.W_key.weight"])
    values = jnp.einsum("btd,ed->bte", x, params["att.W_value.weight"])
    queries = queries.reshape(batch, seq, n_heads, head_dim).swapaxes(1, 2)
    keys = keys.reshape(batch, seq, n_kv, head_dim).swapaxes(1, 2)
    values = values.reshape(batch, seq, n_kv, head_dim).swapaxes(1, 2)
    if "att.q_norm.scale" in params:
        queries = norm(queries, params["att.q_norm.scale"])
        keys = norm(keys, params["att.k_norm.scale"])
    freqs = 1.0 / (500_000.0 ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    pos = jnp.arange(seq, dtype=jnp.float32)
    theta = jnp.outer(pos, freqs)
    theta = jnp.concatenate([theta, theta], axis=-1)
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    queries = queries * cos + rotate_half(queries) * sin
    keys = keys * cos + rotate_half(keys) * sin
    keys = jnp.repeat(keys, n_heads // n_kv, axis=1)
    values = jnp.repeat(values, n_heads // n_kv, axis=1)
    scores = queries @ keys.swapaxes(-1, -2) / jnp.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    context = (weights @ values).swapaxes(1, 2).reshape(batch, seq, n_heads * head_dim)
    return context @ params["att.out_proj.weight"].T
