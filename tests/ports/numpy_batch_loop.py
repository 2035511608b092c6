"""A user's NumPy port looping over the batch, masking the scores in place."""

import numpy as np


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    hd = d // num_heads
    out = np.zeros((b, t, d))
    mask = np.triu(np.ones((t, t), bool), 1)
    for i in range(b):
        q = (x[i] @ params["W_query.weight"].T + params["W_query.bias"]).reshape(t, num_heads, hd)
        k = (x[i] @ params["W_key.weight"].T + params["W_key.bias"]).reshape(t, num_heads, hd)
        v = (x[i] @ params["W_value.weight"].T + params["W_value.bias"]).reshape(t, num_heads, hd)
        q, k, v = q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        s[:, mask] = -np.inf
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        ctx = (w @ v).transpose(1, 0, 2).reshape(t, d)
        out[i] = ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
    return out.astype(x.dtype)
