"""A user's compact NumPy port (the README's quickstart, with biases): the softmax's normalisation,
the product with the values and the merge of the heads in one statement."""

import numpy as np


def mha(params, x, num_heads=2):
    b, t, d = x.shape
    q, k, v = (
        x @ params[f"{name}.weight"].T + params[f"{name}.bias"] for name in ("W_query", "W_key", "W_value")
    )
    q, k, v = (m.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3) for m in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    scores = np.where(np.triu(np.ones((t, t), dtype=bool), k=1), -np.inf, scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    context = (weights / weights.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return context @ params["out_proj.weight"].T + params["out_proj.bias"]
