"""A user's NumPy port looping over the batch and the heads (the naive style), one (T, H) slice at a time."""

import numpy as np


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    hd = d // num_heads
    q = x @ params["W_query.weight"].T + params["W_query.bias"]
    k = x @ params["W_key.weight"].T + params["W_key.bias"]
    v = x @ params["W_value.weight"].T + params["W_value.bias"]
    ctx = np.zeros((b, t, d), dtype=x.dtype)
    for i in range(b):
        for h in range(num_heads):
            qh = q[i, :, h * hd : (h + 1) * hd]
            kh = k[i, :, h * hd : (h + 1) * hd]
            vh = v[i, :, h * hd : (h + 1) * hd]
            s = qh @ kh.T / np.sqrt(hd)
            s[np.triu(np.ones((t, t), bool), 1)] = -np.inf
            w = np.exp(s - s.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            ctx[i, :, h * hd : (h + 1) * hd] = w @ vh
    return ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
