"""A user's plain JAX port with its own gradient rules: a custom_vjp softmax, a custom_jvp scale."""

from functools import partial

import jax
import jax.numpy as jnp


@jax.custom_vjp
def softmax(scores):
    return jax.nn.softmax(scores, axis=-1)


def softmax_fwd(scores):
    weights = softmax(scores)
    return weights, weights


def softmax_bwd(weights, grad):
    return (weights * (grad - jnp.sum(grad * weights, axis=-1, keepdims=True)),)


softmax.defvjp(softmax_fwd, softmax_bwd)


@partial(jax.custom_jvp, nondiff_argnums=(1,))
def scaled(scores, head_dim):
    return scores / jnp.sqrt(head_dim)


@scaled.defjvp
def scaled_jvp(head_dim, primals, tangents):
    (scores,), (d_scores,) = primals, tangents
    return scaled(scores, head_dim), d_scores / jnp.sqrt(head_dim)


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    qkv = [x @ params[f"{n}.weight"].T + params[f"{n}.bias"] for n in ("W_query", "W_key", "W_value")]
    q, k, v = (y.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3) for y in qkv)
    scores = scaled(q @ k.transpose(0, 1, 3, 2), q.shape[-1])
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
    context = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return context @ params["out_proj.weight"].T + params["out_proj.bias"]
