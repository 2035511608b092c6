"""A user's NumPy port of the book's GPT-2 transformer block (``torch_ref.gpt.TransformerBlock``):
small helpers called from several places (``layer_norm`` for both norms, ``linear`` for every
layer), the layer norm's scale applied before its division, one line per step. Weights in the
project's format (``torch_ref.to_params``)."""

import numpy as np


def layer_norm(x, scale, shift, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return scale * (x - mean) / np.sqrt(var + eps) + shift


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def linear(p, name, x):
    return x @ p[name + ".weight"].T + p[name + ".bias"]


def block(p, x, n_heads=3):
    b, t, d = x.shape
    hd = d // n_heads
    h = layer_norm(x, p["norm1.scale"], p["norm1.shift"])
    q = linear(p, "att.W_query", h).reshape(b, t, n_heads, hd)
    k = linear(p, "att.W_key", h).reshape(b, t, n_heads, hd)
    v = linear(p, "att.W_value", h).reshape(b, t, n_heads, hd)
    s = np.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(hd)
    s = np.where(np.tri(t, dtype=bool), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    a = np.einsum("bnqk,bknh->bqnh", w, v).reshape(b, t, d)
    x = x + linear(p, "att.out_proj", a)
    h = layer_norm(x, p["norm2.scale"], p["norm2.shift"])
    h = gelu(linear(p, "ff.layers.0", h))
    return x + linear(p, "ff.layers.2", h)
