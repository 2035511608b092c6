"""A user's NumPy port of grouped-query attention with rotary position embeddings (Llama 3, and
Qwen3's RMSNorm of each query and key head when the weights hold one), written as users write it."""

import numpy as np


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rms_norm(x, w):
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + 1e-6) * w


def rope(x, angles):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = np.cos(angles), np.sin(angles)
    out = np.empty_like(x)
    out[..., :half] = x1 * c - x2 * s
    out[..., half:] = x1 * s + x2 * c
    return out


def gqa(params, x, num_heads=4, num_groups=2):
    b, t, _ = x.shape
    q = x @ params["att.W_query.weight"].T
    k = x @ params["att.W_key.weight"].T
    v = x @ params["att.W_value.weight"].T
    hd = q.shape[-1] // num_heads
    q = q.reshape(b, t, num_heads, hd).transpose(0, 2, 1, 3)
    k = k.reshape(b, t, num_groups, hd).transpose(0, 2, 1, 3)
    v = v.reshape(b, t, num_groups, hd).transpose(0, 2, 1, 3)
    if "att.q_norm.scale" in params:
        q = rms_norm(q, params["att.q_norm.scale"])
        k = rms_norm(k, params["att.k_norm.scale"])
    inv_freq = 1.0 / 500_000.0 ** (np.arange(0, hd, 2) / hd)
    q_pos = np.arange(t, dtype=np.float32)  # queries' positions (a cache adds its length)
    k_pos = np.arange(t, dtype=np.float32)
    q = rope(q, q_pos[:, None] * inv_freq[None, :])
    k = rope(k, k_pos[:, None] * inv_freq[None, :])
    k = np.repeat(k, num_heads // num_groups, axis=1)
    v = np.repeat(v, num_heads // num_groups, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2)
    scores = np.where(np.triu(np.ones((t, t), dtype=bool), k=1), -np.inf, scores)
    weights = softmax(scores / np.sqrt(hd))
    ctx = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, num_heads * hd)
    return ctx @ params["att.out_proj.weight"].T
