"""A user's functional NumPy GPT-2, one sequence at a time: small functions, nested calls,
comprehensions over the heads, a batch loop in the glue. Weights as a nested dict in GPT-2's own
Conv1D layout ((in, out): ``x @ w + b``), mapped from a Hugging Face ``state_dict``."""

import math

import numpy as np


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b


def linear(x, w, b):
    return x @ w + b


def ffn(x, c_fc, c_proj):
    return linear(gelu(linear(x, **c_fc)), **c_proj)


def attention(q, k, v, mask):
    return softmax(q @ k.T / np.sqrt(q.shape[-1]) + mask) @ v


def mha(x, c_attn, c_proj, n_head):
    x = linear(x, **c_attn)  # [T, 3D]
    q, k, v = np.split(x, 3, axis=-1)
    heads = [np.split(m, n_head, axis=-1) for m in (q, k, v)]  # 3 x N x [T, H]
    causal_mask = (1 - np.tri(x.shape[0], dtype=x.dtype)) * -1e10  # [T, T]
    out_heads = [attention(qh, kh, vh, causal_mask) for qh, kh, vh in zip(*heads, strict=True)]
    return linear(np.hstack(out_heads), **c_proj)


def block(x, mlp, attn, ln_1, ln_2, n_head):
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)
    x = x + ffn(layer_norm(x, **ln_2), **mlp)
    return x


def gpt2(ids, wte, wpe, blocks, ln_f, n_head):
    x = wte[ids] + wpe[np.arange(len(ids))]  # [T, D]
    for params in blocks:
        x = block(x, **params, n_head=n_head)
    return layer_norm(x, **ln_f) @ wte.T  # [T, V]


def run(params, token_ids, n_head=3):
    return np.stack([gpt2(ids, **params, n_head=n_head) for ids in token_ids])
