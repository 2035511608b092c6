"""A user's NumPy port of the book's MultiHeadAttention that records the project's steps (it returns
``(output, steps)``), with one bug injectable by name (``bug=``): check_port's step table names the
first diverging step."""

import numpy as np

import numpy_attn


def mha(params, x, *, bug=None, num_heads=2, p=0.0, attn_keep_mask=None):
    """A hand-written NumPy port of the book's MultiHeadAttention; ``bug`` breaks one step."""
    b, t, _ = x.shape
    w = lambda name: params[f"{name}.weight"]  # noqa: E731
    bias = lambda name: params.get(f"{name}.bias", 0)  # noqa: E731
    queries = x @ (w("W_query") if bug == "transposed_projection" else w("W_query").T)
    queries = queries + (0 if bug == "missing_qkv_bias" else bias("W_query"))
    keys = x @ w("W_key").T + bias("W_key")
    values = x @ (w("W_key") if bug == "values_from_key_projection" else w("W_value")).T + bias("W_value")

    def split(m):
        if bug == "heads_split_without_transpose":
            return m.reshape(b, num_heads, t, -1)
        return m.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3)

    q, k, v = split(queries), split(keys), split(values)
    attn_scores = (k @ q.swapaxes(-1, -2)) if bug == "queries_keys_swapped" else q @ k.swapaxes(-1, -2)
    mask = np.triu(np.ones((t, t), bool), k=0 if bug == "mask_off_by_one" else 1)
    if bug == "inverted_mask":
        mask = ~mask
    masked_scores = np.where(mask, -np.inf, attn_scores)
    scale = queries.shape[-1] if bug == "scale_by_d_out" else q.shape[-1]
    attn_weights = numpy_attn.softmax(
        masked_scores / scale**0.5, axis=-2 if bug == "softmax_over_queries" else -1
    )
    dropped = attn_weights
    if attn_keep_mask is not None:
        dropped = attn_weights * attn_keep_mask / (1 if bug == "dropout_not_rescaled" else 1 - p)
    context = dropped @ v  # (B, N, T, H)
    if bug == "heads_merged_without_transpose":
        context_vec = context.reshape(b, t, -1)
    else:
        context_vec = context.transpose(0, 2, 1, 3).reshape(b, t, -1)
    output = context_vec @ w("out_proj").T + (0 if bug == "output_bias_dropped" else bias("out_proj"))
    steps = dict(
        queries=queries,
        keys=keys,
        values=values,
        attn_scores=attn_scores,
        masked_scores=masked_scores,
        attn_weights=attn_weights,
    )
    if attn_keep_mask is not None:
        steps["attn_weights_dropped"] = dropped
    steps["context_vec"] = context_vec
    return output, steps
