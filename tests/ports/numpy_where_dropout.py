"""A user's NumPy port of the book's MultiHeadAttention whose attention dropout keeps the uniform
draws at or above p (as torch's and numpy_attn's) and applies the mask with np.where."""

import numpy as np


def mha(params, x, rng, num_heads=2, dropout=0.2):
    b, t, d = x.shape
    q, k, v = (x @ params[f"{n}.weight"].T + params[f"{n}.bias"] for n in ("W_query", "W_key", "W_value"))
    q, k, v = (y.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3) for y in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    scores = np.where(np.triu(np.ones((t, t), dtype=bool), k=1), -np.inf, scores)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)
    keep = rng.random(weights.shape) >= dropout
    weights = np.where(keep, weights / (1.0 - dropout), 0.0)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return context @ params["out_proj.weight"].T + params["out_proj.bias"]
