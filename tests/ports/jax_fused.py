"""A user's JAX port of their own fused-QKV torch module, (B, T, N, H) throughout."""

import jax
import jax.numpy as jnp


def attention(params, x, n_head=2):
    B, T, C = x.shape
    qkv = jnp.dot(x, params["qkv.weight"].T) + params["qkv.bias"]
    q, k, v = jnp.split(qkv.reshape(B, T, 3 * n_head, C // n_head), 3, axis=2)
    att = jnp.einsum("bqnh,bknh->bnqk", q, k) * (C // n_head) ** -0.5
    keep = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jnp.where(keep[None, None], att, -jnp.inf)
    att = jax.nn.softmax(att, axis=-1)
    y = jnp.einsum("bnqk,bknh->bqnh", att, v)
    return y.reshape(B, T, C) @ params["proj.weight"].T + params["proj.bias"]
