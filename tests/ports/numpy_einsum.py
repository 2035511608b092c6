"""A user's NumPy port written with einsum, in (B, T, N, H) layout."""

import numpy as np


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    hd = d // num_heads
    q = np.einsum("btd,ed->bte", x, params["W_query.weight"]) + params["W_query.bias"]
    k = np.einsum("btd,ed->bte", x, params["W_key.weight"]) + params["W_key.bias"]
    v = np.einsum("btd,ed->bte", x, params["W_value.weight"]) + params["W_value.bias"]
    q = q.reshape(b, t, num_heads, hd)
    k = k.reshape(b, t, num_heads, hd)
    v = v.reshape(b, t, num_heads, hd)
    scores = np.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(hd)
    scores = np.where(np.triu(np.ones((t, t), dtype=bool), k=1), -np.inf, scores)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)
    ctx = np.einsum("bnqk,bknh->bqnh", weights, v).reshape(b, t, d)
    return np.einsum("btd,ed->bte", ctx, params["out_proj.weight"]) + params["out_proj.bias"]
