"""A user's NumPy port computing attention one query at a time: a Python loop over the tokens, each
query's scores against every key a (B, N, S) value, its context written into a buffer."""

import numpy as np


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    hd = d // num_heads

    def heads(name):  # (B, T, D) -> (B, N, T, H)
        y = x @ params[f"{name}.weight"].T + params[f"{name}.bias"]
        return y.reshape(b, t, num_heads, hd).transpose(0, 2, 1, 3)

    q, k, v = heads("W_query"), heads("W_key"), heads("W_value")
    ctx = np.zeros((b, num_heads, t, hd), dtype=x.dtype)
    for i in range(t):
        s = np.einsum("bnh,bnsh->bns", q[:, :, i], k)  # (B, N, S): query i against every key
        s[:, :, i + 1 :] = -np.inf
        s = s / np.sqrt(hd)
        w = np.exp(s - s.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        ctx[:, :, i] = np.einsum("bns,bnsh->bnh", w, v)  # (B, N, H)
    ctx = ctx.transpose(0, 2, 1, 3).reshape(b, t, d)  # (B, T, D)
    return ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
