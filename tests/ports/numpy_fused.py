"""A user's NumPy port of their own fused-QKV torch module (torch_user_block.Attention)."""

import numpy as np


def attention(params, x, n_head=2):
    B, T, C = x.shape
    qkv = x @ params["qkv.weight"].T + params["qkv.bias"]
    q, k, v = np.split(qkv, 3, axis=-1)
    hs = C // n_head
    q = q.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)
    k = k.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)
    v = v.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)
    att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
    keep = np.tril(np.ones((T, T), dtype=bool))
    att = np.where(keep, att, -1e9)
    att = np.exp(att - att.max(axis=-1, keepdims=True))
    att = att / att.sum(axis=-1, keepdims=True)
    y = att @ v
    y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
    return y @ params["proj.weight"].T + params["proj.bias"]
