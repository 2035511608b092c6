"""A user's JAX port running its heads one at a time with jax.lax.scan ((N, B, T, H) per head)."""

import jax
import jax.numpy as jnp


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    hd = d // num_heads

    def split(name):
        y = x @ params[f"{name}.weight"].T + params[f"{name}.bias"]
        return y.reshape(b, t, num_heads, hd).transpose(2, 0, 1, 3)

    causal = jnp.tril(jnp.ones((t, t), bool))

    def head(carry, qkv):
        q, k, v = qkv
        s = q @ k.swapaxes(-1, -2) / jnp.sqrt(hd)
        s = jnp.where(causal, s, -jnp.inf)
        w = jax.nn.softmax(s, axis=-1)
        return carry, w @ v

    _, ctx = jax.lax.scan(head, None, (split("W_query"), split("W_key"), split("W_value")))
    ctx = ctx.transpose(1, 2, 0, 3).reshape(b, t, d)
    return ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
