"""A user's NumPy port masking the book's chapter-3 way: exp weights times np.tril(np.ones(...))."""

import numpy as np


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    hd = d // num_heads
    q = (x @ params["W_query.weight"].T + params["W_query.bias"]).reshape(b, t, num_heads, hd)
    k = (x @ params["W_key.weight"].T + params["W_key.bias"]).reshape(b, t, num_heads, hd)
    v = (x @ params["W_value.weight"].T + params["W_value.bias"]).reshape(b, t, num_heads, hd)
    q, k, v = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2)
    scores = scores / np.sqrt(hd)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights = weights * np.tril(np.ones((t, t)))
    weights = weights / weights.sum(-1, keepdims=True)
    ctx = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
