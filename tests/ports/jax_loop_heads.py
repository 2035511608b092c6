"""A user's plain JAX port computing one head at a time in a Python loop (not jitted: the loop is
unrolled into the traced program, one copy of its body per head)."""

import jax
import jax.numpy as jnp


def mha(params, x, num_heads=2):
    t = x.shape[1]
    hd = params["W_query.weight"].shape[0] // num_heads
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    heads = []
    for h in range(num_heads):
        rows = slice(h * hd, (h + 1) * hd)
        q = x @ params["W_query.weight"][rows].T + params["W_query.bias"][rows]
        k = x @ params["W_key.weight"][rows].T + params["W_key.bias"][rows]
        v = x @ params["W_value.weight"][rows].T + params["W_value.bias"][rows]
        s = q @ k.swapaxes(-1, -2) / jnp.sqrt(hd)
        s = jnp.where(causal, s, -jnp.inf)
        w = jax.nn.softmax(s, axis=-1)
        heads.append(w @ v)
    context = jnp.concatenate(heads, axis=-1)
    return context @ params["out_proj.weight"].T + params["out_proj.bias"]
