"""A user's JAX GPT-2 on a pytree of weights: ``jax.nn.dot_product_attention`` in (B, T, N, H)
layout, each block under ``jax.checkpoint``, the whole model jitted (``gpt2_jit``) or not (``gpt2``).
Its own names (kernels in (in, out) layout, as Flax keeps them)."""

import functools

import jax


def dense(p, x):
    return x @ p["kernel"] + p["bias"]


def norm(p, x, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    centered = x - mean
    variance = (centered**2).mean(-1, keepdims=True)
    return centered * jax.lax.rsqrt(variance + eps) * p["scale"] + p["bias"]


def attention(p, x, num_heads):
    b, t, d = x.shape
    qkv = dense(p["qkv"], x).reshape(b, t, 3, num_heads, d // num_heads)  # (B, T, 3, N, H)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, N, H)
    return dense(p["out"], out.reshape(b, t, d))


def mlp(p, x):
    return dense(p["fc2"], jax.nn.gelu(dense(p["fc1"], x), approximate=True))


@functools.partial(jax.checkpoint, static_argnums=(2,))
def layer(p, x, num_heads):
    x = x + attention(p["attn"], norm(p["norm1"], x), num_heads)
    x = x + mlp(p["mlp"], norm(p["norm2"], x))
    return x


def gpt2(params, token_ids, num_heads=3):
    t = token_ids.shape[1]
    x = params["embed"]["tokens"][token_ids] + params["embed"]["positions"][:t]  # (B, T, D)
    for p in params["layers"]:
        x = layer(p, x, num_heads)
    return norm(params["norm_f"], x) @ params["embed"]["tokens"].T  # (B, T, V)


gpt2_jit = jax.jit(gpt2, static_argnames="num_heads")
