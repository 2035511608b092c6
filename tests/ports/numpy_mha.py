"""A user's NumPy port of the book's MultiHeadAttention, written as users write them."""

import numpy as np


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def mha(params, x, num_heads=2):
    b, t, d_in = x.shape
    q = x @ params["W_query.weight"].T + params["W_query.bias"]
    k = x @ params["W_key.weight"].T + params["W_key.bias"]
    v = x @ params["W_value.weight"].T + params["W_value.bias"]
    d_out = q.shape[-1]
    hd = d_out // num_heads
    q = q.reshape(b, t, num_heads, hd).transpose(0, 2, 1, 3)
    k = k.reshape(b, t, num_heads, hd).transpose(0, 2, 1, 3)
    v = v.reshape(b, t, num_heads, hd).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2)
    mask = np.triu(np.ones((t, t), dtype=bool), k=1)
    scores = np.where(mask, -np.inf, scores)
    scores = scores / np.sqrt(hd)
    weights = softmax(scores, axis=-1)
    ctx = weights @ v
    ctx = ctx.transpose(0, 2, 1, 3).reshape(b, t, d_out)
    out = ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
    return out
