"""A user's plain JAX port of torch.nn.MultiheadAttention (batch_first), on its state_dict."""

import jax
import jax.numpy as jnp


def mha(params, query, key, value, num_heads=2):
    b, t, d = query.shape
    w_q, w_k, w_v = jnp.split(params["in_proj_weight"], 3)
    b_q, b_k, b_v = jnp.split(params["in_proj_bias"], 3)
    q = (query @ w_q.T + b_q).reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3)
    k = (key @ w_k.T + b_k).reshape(b, -1, num_heads, d // num_heads).transpose(0, 2, 1, 3)
    v = (value @ w_v.T + b_v).reshape(b, -1, num_heads, d // num_heads).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d // num_heads)
    weights = jax.nn.softmax(scores, axis=-1)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return context @ params["out_proj.weight"].T + params["out_proj.bias"]
