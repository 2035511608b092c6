"""A user's JAX port computing attention one query at a time: jax.lax.scan over the tokens, each
query's scores against every key a (B, N, S) value."""

import jax
import jax.numpy as jnp


def mha(params, x, num_heads=2):
    x = jnp.asarray(x)
    b, t, d = x.shape
    hd = d // num_heads

    def heads(name):  # (B, T, D) -> (B, T, N, H)
        y = x @ params[f"{name}.weight"].T + params[f"{name}.bias"]
        return y.reshape(b, t, num_heads, hd)

    q, k, v = heads("W_query"), heads("W_key"), heads("W_value")
    positions = jnp.arange(t)

    def query(carry, i):
        s = jnp.einsum("bnh,bsnh->bns", q[:, i], k) / jnp.sqrt(hd)  # (B, N, S)
        s = jnp.where(positions > i, -jnp.inf, s)
        w = jax.nn.softmax(s, axis=-1)
        return carry, jnp.einsum("bns,bsnh->bnh", w, v)  # (B, N, H)

    _, ctx = jax.lax.scan(query, None, positions)  # (T, B, N, H)
    ctx = ctx.transpose(1, 0, 2, 3).reshape(b, t, d)  # (B, T, D)
    return ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
