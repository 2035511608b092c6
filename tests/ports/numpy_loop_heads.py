"""A user's NumPy port computing one head at a time (the notes' wrapper style), float64 throughout."""

import numpy as np


def mha(params, x, num_heads=2):
    x = x.astype(np.float64)
    t = x.shape[1]
    wq, wk, wv = (params[f"{n}.weight"].astype(np.float64) for n in ("W_query", "W_key", "W_value"))
    bq, bk, bv = (params[f"{n}.bias"].astype(np.float64) for n in ("W_query", "W_key", "W_value"))
    hd = wq.shape[0] // num_heads
    heads = []
    for i in range(num_heads):
        rows = slice(i * hd, (i + 1) * hd)
        q = x @ wq[rows].T + bq[rows]
        k = x @ wk[rows].T + bk[rows]
        v = x @ wv[rows].T + bv[rows]
        s = q @ k.swapaxes(-1, -2) / np.sqrt(hd)
        s[:, np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] = -np.inf
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        heads.append(w @ v)
    ctx = np.concatenate(heads, axis=-1)
    return ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
