"""The bug catalogue: ports written as users write them, and bugs planted in them one line at a time.

Each ``Bug`` replaces one line of a port file (``line``, which occurs there exactly once) by
``planted``; ``locate`` must report the planted line as ``candidate_location``.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
from dataclasses import dataclass

import numpy as np

HERE = pathlib.Path(__file__).parent
D_MODEL, NUM_HEADS, BATCH, TOKENS = 8, 2, 3, 5  # distinct sizes: B=3, T=5, N=2, H=4, D=8


@dataclass(frozen=True)
class Bug:
    name: str
    port: str
    line: str
    planted: str
    cause: str | None = None  # a phrase one of the causes contains (the numbers show every one here)


def reference(kind: str):
    """``torch_ref``: the book's MultiHeadAttention; ``user_torch``: a user's own fused module;
    ``user_mqa``: a user's own multi-query module (one key and value head)."""
    import torch

    torch.manual_seed(0)
    if kind == "torch_ref":
        from torch_ref import MultiHeadAttention

        return MultiHeadAttention(D_MODEL, D_MODEL, 16, 0.0, num_heads=NUM_HEADS, qkv_bias=True)
    if kind == "user_mqa":
        return load("torch_user_mqa", (HERE / "torch_user_mqa.py").read_text()).MultiQueryAttention(
            D_MODEL, NUM_HEADS
        )
    return load("torch_user_block", (HERE / "torch_user_block.py").read_text()).Attention(D_MODEL, NUM_HEADS)


WITHOUT_PARAMS = {
    "nnx_mha",
    "nnx_jit_mha",
    "nnx_dropout_mha",
}  # these hold their weights: locate passes them none
PORTS = {  # port -> (reference kind, how to build the candidate from the loaded module and the weights)
    "numpy_mha": ("torch_ref", lambda module, params: module.mha),
    "jax_mha": ("torch_ref", lambda module, params: module.mha),
    "jax_jit_mha": ("torch_ref", lambda module, params: module.mha),
    "nnx_mha": ("torch_ref", lambda module, params: _nnx(module, params)),
    "numpy_fused": ("user_torch", lambda module, params: module.attention),
    "jax_fused": ("user_torch", lambda module, params: module.attention),
    "numpy_loop_heads": ("torch_ref", lambda module, params: module.mha),
    "numpy_head_buffer": ("torch_ref", lambda module, params: module.mha),
    "numpy_einsum": ("torch_ref", lambda module, params: module.mha),
    "numpy_scipy_softmax": ("torch_ref", lambda module, params: module.mha),
    "numpy_batch_head_loop": ("torch_ref", lambda module, params: module.mha),
    "numpy_batch_loop": ("torch_ref", lambda module, params: module.mha),
    "numpy_mult_mask": ("torch_ref", lambda module, params: module.mha),
    "numpy_scale_first": ("torch_ref", lambda module, params: module.mha),
    "numpy_inline_softmax": ("torch_ref", lambda module, params: module.mha),
    "jax_dpa": ("torch_ref", lambda module, params: module.mha),
    "jax_scan_heads": ("torch_ref", lambda module, params: module.mha),
    "jax_loop_heads": ("torch_ref", lambda module, params: module.mha),
    "numpy_query_rows": ("torch_ref", lambda module, params: module.mha),
    "jax_scan_tokens": ("torch_ref", lambda module, params: module.mha),
    "torch_sdpa": ("torch_ref", lambda module, params: module.mha),
    "torch_sdpa_scale": ("torch_ref", lambda module, params: module.mha),
    "torch_sdpa_mqa": ("user_mqa", lambda module, params: module.mqa),
    "nnx_jit_mha": ("torch_ref", lambda module, params: _nnx_jit(module, params)),
    "nnx_dropout_mha": ("torch_ref", lambda module, params: module.build(params, NUM_HEADS)),
}


def _nnx(module, params):
    from flax import nnx

    return module.MHA(D_MODEL, D_MODEL, NUM_HEADS, rngs=nnx.Rngs(0)).load_torch(params)


def _nnx_jit(module, params):
    """An ``nnx.jit`` function closing over the model: it holds its weights (``WITHOUT_PARAMS``)."""
    model = module.FusedMHA(params, NUM_HEADS)
    return functools.partial(module.run, model)


def load(name: str, source: str, directory: pathlib.Path | None = None):
    """Import ``source`` as a module from a file (the file's lines are what locate reports)."""
    path = (directory or HERE) / f"{name}.py"
    if directory is not None:
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"ports_{name}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plant(bug: Bug) -> tuple[str, int]:
    """The port's source with the bug planted, and the planted line's number."""
    lines = (HERE / f"{bug.port}.py").read_text().splitlines()
    found = [i for i, line in enumerate(lines) if line.strip() == bug.line]
    if len(found) != 1:
        raise ValueError(f"{bug.name}: {bug.line!r} occurs {len(found)} times in {bug.port}.py")
    indent = lines[found[0]][: len(lines[found[0]]) - len(lines[found[0]].lstrip())]
    lines[found[0]] = indent + bug.planted
    return "\n".join(lines) + "\n", found[0] + 1


def inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, TOKENS, D_MODEL)).astype(np.float32)


B = Bug
BUGS = [
    # NumPy port calling SciPy's softmax (its conversions keep the values traced)
    B(
        "scipy_mask_keeps_next_token",
        "numpy_scipy_softmax",
        "scores[..., np.triu(np.ones((t, t)), k=1).astype(bool)] = -np.inf",
        "scores[..., np.triu(np.ones((t, t)), k=2).astype(bool)] = -np.inf",
        "causal mask off by one",
    ),
    B(
        "scipy_scale_by_d_model",
        "numpy_scipy_softmax",
        "weights = softmax(scores / np.sqrt(hd), axis=-1)",
        "weights = softmax(scores / np.sqrt(d), axis=-1)",
        "scale differs",
    ),
    B(
        "scipy_softmax_over_queries",
        "numpy_scipy_softmax",
        "weights = softmax(scores / np.sqrt(hd), axis=-1)",
        "weights = softmax(scores / np.sqrt(hd), axis=-2)",
        "softmax over the wrong axis",
    ),
    # NumPy port computing one head at a time
    B(
        "np_loop_queries_keys_swapped",
        "numpy_loop_heads",
        "s = q @ k.swapaxes(-1, -2) / np.sqrt(hd)",
        "s = k @ q.swapaxes(-1, -2) / np.sqrt(hd)",
        "transposed over (query, key)",
    ),
    # NumPy port scaling the scores in place before the mask
    B(
        "np_inplace_scale_by_head_dim",
        "numpy_scale_first",
        "s[...] = s / np.sqrt(hd)",
        "s[...] = s / hd",
        "scale differs: yours is smaller by sqrt(head_dim)",
    ),
    B(
        "np_inplace_scale_by_d",
        "numpy_scale_first",
        "s[...] = s / np.sqrt(hd)",
        "s[...] = s / np.sqrt(d)",
        "scale differs: yours is smaller by sqrt(num_heads)",
    ),
    # NumPy port filling a zeros buffer head by head
    B(
        "np_buffer_same_value_head_each_time",
        "numpy_head_buffer",
        "vh = v[:, :, h * hd : (h + 1) * hd]",
        "vh = v[:, :, 0:hd]",
        "equals head 0 of the reference's values",
    ),
    B(
        "np_buffer_scale_by_d",
        "numpy_head_buffer",
        "s = s / np.sqrt(hd)",
        "s = s / np.sqrt(d)",
        "scale differs: yours is smaller by sqrt(num_heads)",
    ),
    B(
        "np_buffer_mask_keeps_next_token",
        "numpy_head_buffer",
        "s[:, np.triu(np.ones((t, t), bool), 1)] = -np.inf",
        "s[:, np.triu(np.ones((t, t), bool), 2)] = -np.inf",
        "causal mask off by one: the next token (key = query + 1) is not hidden",
    ),
    B(
        "np_buffer_written_at_the_wrong_head",
        "numpy_head_buffer",
        "ctx[:, :, h * hd : (h + 1) * hd] = w @ vh",
        "ctx[:, :, (1 - h) * hd : (2 - h) * hd] = w @ vh",
        "your head 1 holds the reference's head 0",
    ),
    # NumPy port looping over the batch and the heads
    B(
        "np_batch_head_loop_scale_by_head_dim",
        "numpy_batch_head_loop",
        "s = qh @ kh.T / np.sqrt(hd)",
        "s = qh @ kh.T / hd",
        "scale differs: yours is smaller by sqrt(head_dim)",
    ),
    B(
        "np_batch_head_loop_context_from_queries",
        "numpy_batch_head_loop",
        "ctx[i, :, h * hd : (h + 1) * hd] = w @ vh",
        "ctx[i, :, h * hd : (h + 1) * hd] = w @ qh",
        "another variable: this takes the reference's queries",
    ),
    # NumPy port looping over the batch, masking in place
    B(
        "np_batch_loop_scale_by_head_dim",
        "numpy_batch_loop",
        "s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)",
        "s = q @ k.transpose(0, 2, 1) / hd",
        "scale differs: yours is smaller by sqrt(head_dim)",
    ),
    B(
        "np_batch_loop_mask_inverted",
        "numpy_batch_loop",
        "s[:, mask] = -np.inf",
        "s[:, ~mask] = -np.inf",
        "mask inverted",
    ),
    # NumPy port masking its exp weights by multiplying with np.tril(np.ones(...))
    B(
        "np_mult_mask_scale_by_head_dim",
        "numpy_mult_mask",
        "scores = scores / np.sqrt(hd)",
        "scores = scores / hd",
        "scale differs: yours is smaller by sqrt(head_dim)",
    ),
    B(  # the product with the values and the merge of the heads in one statement
        "np_mult_mask_heads_merged_without_transpose",
        "numpy_mult_mask",
        "ctx = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)",
        "ctx = (weights @ v).reshape(b, t, d)",
        "a reshape without the transpose",
    ),
    # compact NumPy port (the README's quickstart): the softmax's normalisation, the product with the
    # values and the merge of the heads in one statement
    B(
        "np_inline_softmax_heads_merged_without_transpose",
        "numpy_inline_softmax",
        "context = (weights / weights.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)",
        "context = (weights / weights.sum(-1, keepdims=True) @ v).reshape(b, t, d)",
        "a reshape without the transpose",
    ),
    # NumPy port of the book's class
    B(
        "np_query_weight_not_transposed",
        "numpy_mha",
        'q = x @ params["W_query.weight"].T + params["W_query.bias"]',
        'q = x @ params["W_query.weight"] + params["W_query.bias"]',
        "with W_query.weight transposed",
    ),
    B(
        "np_query_bias_missing",
        "numpy_mha",
        'q = x @ params["W_query.weight"].T + params["W_query.bias"]',
        'q = x @ params["W_query.weight"].T',
        "a bias missing",
    ),
    B(
        "np_values_from_key_weights",
        "numpy_mha",
        'v = x @ params["W_value.weight"].T + params["W_value.bias"]',
        'v = x @ params["W_key.weight"].T + params["W_key.bias"]',
        "equals the reference's keys",
    ),
    # values projected with the key weights on a line before they are used (QA): the line computing them
    B(
        "np_einsum_values_from_key_weights",
        "numpy_einsum",
        'v = np.einsum("btd,ed->bte", x, params["W_value.weight"]) + params["W_value.bias"]',
        'v = np.einsum("btd,ed->bte", x, params["W_key.weight"]) + params["W_key.bias"]',
        "equals the reference's keys",
    ),
    B(
        "np_buffer_values_from_key_weights",
        "numpy_head_buffer",
        'v = x @ params["W_value.weight"].T + params["W_value.bias"]',
        'v = x @ params["W_key.weight"].T + params["W_key.bias"]',
        "equals the reference's keys",
    ),
    B(
        "jax_loop_values_from_key_weights",
        "jax_loop_heads",
        'v = x @ params["W_value.weight"][rows].T + params["W_value.bias"][rows]',
        'v = x @ params["W_key.weight"][rows].T + params["W_key.bias"][rows]',
        "equals the reference's keys",
    ),
    B(
        "jax_scan_values_from_key_weights",
        "jax_scan_heads",
        '_, ctx = jax.lax.scan(head, None, (split("W_query"), split("W_key"), split("W_value")))',
        '_, ctx = jax.lax.scan(head, None, (split("W_query"), split("W_key"), split("W_key")))',
        "equals the reference's keys",
    ),
    B(
        "np_heads_split_without_transpose",
        "numpy_mha",
        "q = q.reshape(b, t, num_heads, hd).transpose(0, 2, 1, 3)",
        "q = q.reshape(b, num_heads, t, hd)",
        "yours holds the reference's queries",
    ),
    B(
        "np_queries_keys_swapped",
        "numpy_mha",
        "scores = q @ k.transpose(0, 1, 3, 2)",
        "scores = k @ q.transpose(0, 1, 3, 2)",
        "transposed over (query, key)",
    ),
    B(
        "np_mask_off_by_one",
        "numpy_mha",
        "mask = np.triu(np.ones((t, t), dtype=bool), k=1)",
        "mask = np.triu(np.ones((t, t), dtype=bool), k=0)",
        "causal mask off by one: the diagonal (each token itself) is hidden too",
    ),
    B(
        "np_mask_keeps_next_token",
        "numpy_mha",
        "mask = np.triu(np.ones((t, t), dtype=bool), k=1)",
        "mask = np.triu(np.ones((t, t), dtype=bool), k=2)",
        "causal mask off by one: the next token (key = query + 1) is not hidden",
    ),
    B(
        "np_mask_inverted",
        "numpy_mha",
        "scores = np.where(mask, -np.inf, scores)",
        "scores = np.where(mask, scores, -np.inf)",
        "mask inverted",
    ),
    B(
        "np_scale_by_d_out",
        "numpy_mha",
        "scores = scores / np.sqrt(hd)",
        "scores = scores / np.sqrt(d_out)",
        "scale differs: yours is smaller by sqrt(num_heads)",
    ),
    B(
        "np_softmax_over_queries",
        "numpy_mha",
        "weights = softmax(scores, axis=-1)",
        "weights = softmax(scores, axis=-2)",
        "softmax over the wrong axis",
    ),
    B(
        "np_heads_merged_without_transpose",
        "numpy_mha",
        "ctx = ctx.transpose(0, 2, 1, 3).reshape(b, t, d_out)",
        "ctx = ctx.reshape(b, t, d_out)",
        "a reshape without the transpose",
    ),
    B(
        "np_output_bias_missing",
        "numpy_mha",
        'out = ctx @ params["out_proj.weight"].T + params["out_proj.bias"]',
        'out = ctx @ params["out_proj.weight"].T',
        "a bias missing",
    ),
    # plain JAX port
    B(
        "jax_linear_weight_not_transposed",
        "jax_mha",
        'return x @ params[f"{name}.weight"].T + params[f"{name}.bias"]',
        'return x @ params[f"{name}.weight"] + params[f"{name}.bias"]',
        "weight transposed: yours is the reference's",
    ),
    B(
        "jax_keys_from_query_projection",
        "jax_mha",
        'keys = linear(params, "W_key", x)',
        'keys = linear(params, "W_query", x)',
        "equals the reference's queries",
    ),
    B(
        "jax_values_split_without_transpose",
        "jax_mha",
        "values = values.reshape(b, t, num_heads, head_dim).swapaxes(1, 2)",
        "values = values.reshape(b, num_heads, t, head_dim)",
        "a reshape without the transpose",
    ),
    B(
        "jax_causal_mask_inverted",
        "jax_mha",
        "attn_scores = jnp.where(causal, attn_scores, -jnp.inf)",
        "attn_scores = jnp.where(causal, -jnp.inf, attn_scores)",
        "mask inverted",
    ),
    B(
        "jax_fill_zero",
        "jax_mha",
        "attn_scores = jnp.where(causal, attn_scores, -jnp.inf)",
        "attn_scores = jnp.where(causal, attn_scores, 0.0)",
        "masked with 0 where the reference has -inf",
    ),
    B(
        "jax_scale_not_square_root",
        "jax_mha",
        "attn_weights = jax.nn.softmax(attn_scores / jnp.sqrt(head_dim), axis=-1)",
        "attn_weights = jax.nn.softmax(attn_scores / head_dim, axis=-1)",
        "scaled by 1/head_dim, where the reference scales by 1/sqrt(head_dim)",
    ),
    B(
        "jax_weights_transposed_in_context",
        "jax_mha",
        "context = attn_weights @ values",
        "context = attn_weights.swapaxes(-1, -2) @ values",
        "transposed over (query, key): the wrong axes transposed",
    ),
    B(
        "jax_heads_merged_without_transpose",
        "jax_mha",
        "context = context.swapaxes(1, 2).reshape(b, t, num_heads * head_dim)",
        "context = context.reshape(b, t, num_heads * head_dim)",
        "a reshape without the transpose",
    ),
    # jitted JAX port in (B, T, N, H) layout
    B(
        "jit_value_bias_from_key",
        "jax_jit_mha",
        'v = (x @ wv + params["W_value.bias"]).reshape(b, t, num_heads, h)',
        'v = (x @ wv + params["W_key.bias"]).reshape(b, t, num_heads, h)',
        "taken from another layer",
    ),
    B(
        "jit_prescale_by_d_model",
        "jax_jit_mha",
        "q = q / jnp.sqrt(h).astype(q.dtype)",
        "q = q / jnp.sqrt(d).astype(q.dtype)",
        "scaled by 1/sqrt(d_out), where the reference scales by 1/sqrt(head_dim)",
    ),
    B(
        "jit_einsum_keys_for_queries",
        "jax_jit_mha",
        's = jnp.einsum("btnh,bsnh->bnts", q, k)',
        's = jnp.einsum("btnh,bsnh->bnts", k, q)',
        "transposed over (query, key)",
    ),
    B(
        "jit_mask_strict",
        "jax_jit_mha",
        "allowed = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]",
        "allowed = jnp.arange(t)[:, None] > jnp.arange(t)[None, :]",
        "causal mask off by one: the diagonal (each token itself) is hidden too",
    ),
    B(
        "jit_softmax_wrong_axis",
        "jax_jit_mha",
        "p = jax.nn.softmax(s, axis=-1)",
        "p = jax.nn.softmax(s, axis=-2)",
        "softmax over the wrong axis",
    ),
    B(
        "jit_context_einsum_heads_mixed",
        "jax_jit_mha",
        'o = jnp.einsum("bnts,bsnh->btnh", p, v)',
        'o = jnp.einsum("bnts,bsnh->bnth", p, v).reshape(b, t, num_heads, h)',
        "a reshape without the transpose",
    ),
    # JAX port running its heads with jax.lax.scan
    B(
        "scan_softmax_over_queries",
        "jax_scan_heads",
        "w = jax.nn.softmax(s, axis=-1)",
        "w = jax.nn.softmax(s, axis=-2)",
        "softmax over the wrong axis",
    ),
    # JAX port running its heads in a Python loop (unrolled when traced)
    B(
        "loop_softmax_over_queries",
        "jax_loop_heads",
        "w = jax.nn.softmax(s, axis=-1)",
        "w = jax.nn.softmax(s, axis=-2)",
        "softmax over the wrong axis",
    ),
    B(
        "loop_mask_transposed",
        "jax_loop_heads",
        "s = jnp.where(causal, s, -jnp.inf)",
        "s = jnp.where(causal.T, s, -jnp.inf)",
        "mask transposed",
    ),
    # NNX module with its own weight loader
    B(
        "nnx_scale_by_num_heads",
        "nnx_mha",
        "scores = jnp.matmul(q, k.transpose(0, 1, 3, 2)) / h**0.5",
        "scores = jnp.matmul(q, k.transpose(0, 1, 3, 2)) / n**0.5",
        "scale differs: yours is larger by sqrt(num_heads)",
    ),
    B(
        "nnx_values_from_key_layer",
        "nnx_mha",
        "v = self.value(x)",
        "v = self.key(x)",
        "equals the reference's keys",
    ),
    B(
        "nnx_mask_inverted",
        "nnx_mha",
        "scores = jnp.where(mask, -1e9, scores)",
        "scores = jnp.where(mask, scores, -1e9)",
        "mask inverted",
    ),
    B(
        "nnx_softmax_of_exp",
        "nnx_mha",
        "weights = jax.nn.softmax(scores, axis=-1)",
        "weights = jax.nn.softmax(scores, axis=-1) * 2",
        "scale differs: yours is larger by sqrt(head_dim)",
    ),
    B(
        "nnx_merge_without_transpose",
        "nnx_mha",
        "context = context.transpose(0, 2, 1, 3).reshape(b, t, n * h)",
        "context = context.reshape(b, t, n * h)",
        "a reshape without the transpose",
    ),
    # NNX module with a dropout, in eval mode
    B(
        "nnx_dropout_not_deterministic",
        "nnx_dropout_mha",
        "weights = self.dropout(weights)",
        "weights = self.dropout(weights, deterministic=False)",
        "a dropout left on",
    ),
    # JAX port on jax.nn.dot_product_attention
    B(
        "dpa_not_causal",
        "jax_dpa",
        'out = jax.nn.dot_product_attention(heads("W_query"), heads("W_key"), heads("W_value"), '
        "is_causal=True)",
        'out = jax.nn.dot_product_attention(heads("W_query"), heads("W_key"), heads("W_value"))',
        "the causal mask is missing",
    ),
    # torch port on F.scaled_dot_product_attention
    B(
        "sdpa_not_causal",
        "torch_sdpa",
        "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)",
        "y = F.scaled_dot_product_attention(q, k, v)",
        "the causal mask is missing",
    ),
    B(
        "sdpa_scale_not_causal",
        "torch_sdpa_scale",
        "y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)",
        "y = F.scaled_dot_product_attention(q, k, v, scale=1.0)",
        "the causal mask is missing",
    ),
    B(
        "sdpa_mqa_mask_missing",
        "torch_sdpa_mqa",
        "y = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=allowed)",
        "y = F.scaled_dot_product_attention(q.transpose(1, 2), k, v)",
        "the causal mask is missing",
    ),
    # NumPy port of a user's own fused torch module
    B(
        "fused_split_order",
        "numpy_fused",
        "q, k, v = np.split(qkv, 3, axis=-1)",
        "q, v, k = np.split(qkv, 3, axis=-1)",
        "equals the reference's split",
    ),
    B(
        "fused_scale_by_c",
        "numpy_fused",
        "att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)",
        "att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(C)",
        "scale differs: yours is smaller by sqrt(num_heads)",
    ),
    B(
        "fused_keep_mask_upper",
        "numpy_fused",
        "keep = np.tril(np.ones((T, T), dtype=bool))",
        "keep = np.triu(np.ones((T, T), dtype=bool))",
        "mask transposed",
    ),
    B(
        "fused_merge_without_transpose",
        "numpy_fused",
        "y = y.transpose(0, 2, 1, 3).reshape(B, T, C)",
        "y = y.reshape(B, T, C)",
        "a reshape without the transpose",
    ),
    # JAX port of a user's own fused torch module
    B(
        "jaxfused_qkv_bias_missing",
        "jax_fused",
        'qkv = jnp.dot(x, params["qkv.weight"].T) + params["qkv.bias"]',
        'qkv = jnp.dot(x, params["qkv.weight"].T)',
        "a bias missing",
    ),
    B(
        "jaxfused_context_from_queries",
        "jax_fused",
        'y = jnp.einsum("bnqk,bknh->bqnh", att, v)',
        'y = jnp.einsum("bnqk,bknh->bqnh", att, q)',
        "another variable: this takes the reference's split",
    ),
    B(
        "jaxfused_scale_by_heads",
        "jax_fused",
        'att = jnp.einsum("bqnh,bknh->bnqk", q, k) * (C // n_head) ** -0.5',
        'att = jnp.einsum("bqnh,bknh->bnqk", q, k) * n_head**-0.5',
        "scale differs: yours is larger by sqrt(num_heads)",
    ),
    B(
        "jaxfused_keep_mask_transposed",
        "jax_fused",
        "att = jnp.where(keep[None, None], att, -jnp.inf)",
        "att = jnp.where(keep.T[None, None], att, -jnp.inf)",
        "mask transposed",
    ),
]

# Gradient parity: ports whose forward pass is right and whose backward pass is not. ``locate_gradients``
# must report the planted line. NumPy ports have no gradients.
# Ports computing attention one query at a time (a (B, N, S) row of the reference's (B, N, T, S)
# scores per token), checked through ``check_port``: their causes once raised instead of reporting.
ROW_BUGS = [
    B(
        "rows_scale_by_d_model",
        "numpy_query_rows",
        "s = s / np.sqrt(hd)",
        "s = s / np.sqrt(d)",
        "scale differs: yours is the reference's div",
    ),
    B(
        "rows_mask_keeps_next_token",
        "numpy_query_rows",
        "s[:, :, i + 1 :] = -np.inf",
        "s[:, :, i + 2 :] = -np.inf",
        "causal mask off by one: the next token (key = query + 1) is not hidden",
    ),
    B(
        "rows_softmax_over_heads",
        "numpy_query_rows",
        "w = w / w.sum(-1, keepdims=True)",
        "w = w / w.sum(-2, keepdims=True)",
        "normalised over the head axis instead of the key axis",
    ),
    B(
        "scan_rows_scale_by_d_model",
        "jax_scan_tokens",
        's = jnp.einsum("bnh,bsnh->bns", q[:, i], k) / jnp.sqrt(hd)  # (B, N, S)',
        's = jnp.einsum("bnh,bsnh->bns", q[:, i], k) / jnp.sqrt(d)  # (B, N, S)',
        "scale differs",
    ),
    B(
        "scan_rows_mask_keeps_next_token",
        "jax_scan_tokens",
        "s = jnp.where(positions > i, -jnp.inf, s)",
        "s = jnp.where(positions > i + 1, -jnp.inf, s)",
        "causal mask off by one: the next token (key = query + 1) is not hidden",
    ),
    B(
        "scan_rows_softmax_over_heads",
        "jax_scan_tokens",
        "w = jax.nn.softmax(s, axis=-1)",
        "w = jax.nn.softmax(s, axis=1)",
        "normalised over the head axis instead of the key axis",
    ),
]


GRADIENT_PORTS = {
    **{port: spec for port, spec in PORTS.items() if not port.startswith("numpy")},
    "jax_custom_rules": ("torch_ref", lambda module, params: module.mha),
}
INTEGER_INPUTS = {"grad_integer_cast_of_the_input"}  # planted where an integer cast is exact


def integer_inputs(seed: int = 0) -> np.ndarray:
    """Integer-valued inputs: casting them to integers and back changes no value, only gradients."""
    return np.round(4 * inputs(seed))


GRADIENT_BUGS = [
    B(
        "grad_stop_gradient_on_values",
        "jax_mha",
        'values = linear(params, "W_value", x)',
        'values = jax.lax.stop_gradient(linear(params, "W_value", x))',
        "the line using it stops the gradient",
    ),
    B(
        "grad_weights_stopped_in_the_helper",
        "jax_mha",
        'return x @ params[f"{name}.weight"].T + params[f"{name}.bias"]',
        'return x @ jax.lax.stop_gradient(params[f"{name}.weight"]).T + params[f"{name}.bias"]',
        "no gradient reaches the value of out_proj.weight",
    ),
    # the input's cotangent is the reference's less what reaches it through the values' projection:
    # the cause is read from the cast's integer dtype, not from the numbers (only each value's whole
    # cotangent is recorded, not what each use adds to it)
    B(
        "grad_integer_cast_of_the_input",
        "jax_mha",
        'values = linear(params, "W_value", x)',  # x feeds the query and key projections first
        'values = linear(params, "W_value", x.astype(jnp.int32).astype(x.dtype))',
        "part of the gradient of input1 is lost",
    ),
    B(
        "grad_jitted_stop_gradient_on_keys",
        "jax_jit_mha",
        'k = (x @ wk + params["W_key.bias"]).reshape(b, t, num_heads, h)',
        'k = jax.lax.stop_gradient(x @ wk + params["W_key.bias"]).reshape(b, t, num_heads, h)',
        "the line using it stops the gradient",
    ),
    B(
        "grad_nnx_detached_values",
        "nnx_mha",
        "v = self.value(x)",
        "v = jax.lax.stop_gradient(self.value(x))",
        "the line using it stops the gradient",
    ),
    B(
        "grad_custom_vjp_bwd_without_the_sum",
        "jax_custom_rules",
        "return (weights * (grad - jnp.sum(grad * weights, axis=-1, keepdims=True)),)",
        "return (weights * grad,)",
        "the custom_vjp_call rule gives its input a wrong cotangent",
    ),
    B(
        "grad_custom_jvp_scale_not_square_root",
        "jax_custom_rules",
        "return scaled(scores, head_dim), d_scores / jnp.sqrt(head_dim)",
        "return scaled(scores, head_dim), d_scores / head_dim",
        "the cotangent is the reference's times 0.5",
    ),
    B(
        "grad_torch_keys_detached",
        "torch_sdpa",
        "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)",
        "y = F.scaled_dot_product_attention(q, k.detach(), v, is_causal=True)",
        "the line using it stops the gradient",
    ),
]
