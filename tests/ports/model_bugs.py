"""Bugs planted in the whole-model ports (``models.MODEL_PORTS``), one line each, as in
``catalogue.BUGS``: ``locate`` must report the planted line; ``cause`` is a phrase one of the
causes must contain where the data shows one (None where it shows none)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelBug:
    name: str
    port: str  # a key of models.MODEL_PORTS
    line: str
    planted: str
    cause: str | None = None


B = ModelBug
MODEL_BUGS = [
    # functional NumPy GPT-2, one sequence at a time (against transformers' GPT2LMHeadModel)
    B(
        "np_gelu_erf",
        "numpy_gpt2",
        "return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))",
        "return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))",
        "GELU",
    ),
    B(
        "np_softmax_over_queries_in_helper",
        "numpy_gpt2",
        "return e / np.sum(e, axis=-1, keepdims=True)",
        "return e / np.sum(e, axis=0, keepdims=True)",
        None,
    ),
    B(
        "np_norm_std_for_variance",
        "numpy_gpt2",
        "variance = np.var(x, axis=-1, keepdims=True)",
        "variance = np.std(x, axis=-1, keepdims=True)",
        None,
    ),
    B(
        "np_queries_keys_swapped_at_the_split",
        "numpy_gpt2",
        "q, k, v = np.split(x, 3, axis=-1)",
        "k, q, v = np.split(x, 3, axis=-1)",
        "operands swapped where they are split",
    ),
    B(
        "np_mask_inverted",
        "numpy_gpt2",
        "causal_mask = (1 - np.tri(x.shape[0], dtype=x.dtype)) * -1e10  # [T, T]",
        "causal_mask = np.tri(x.shape[0], dtype=x.dtype) * -1e10  # [T, T]",
        "mask inverted",
    ),
    B(
        "np_mask_hides_the_diagonal",
        "numpy_gpt2",
        "causal_mask = (1 - np.tri(x.shape[0], dtype=x.dtype)) * -1e10  # [T, T]",
        "causal_mask = (1 - np.tri(x.shape[0], k=-1, dtype=x.dtype)) * -1e10  # [T, T]",
        "off by one",
    ),
    B(
        "np_scale_left_out",
        "numpy_gpt2",
        "return softmax(q @ k.T / np.sqrt(q.shape[-1]) + mask) @ v",
        "return softmax(q @ k.T + mask) @ v",
        "scale",
    ),
    B(
        "np_projection_weight_transposed",
        "numpy_gpt2",
        "return linear(np.hstack(out_heads), **c_proj)",
        'return linear(np.hstack(out_heads), c_proj["w"].T, c_proj["b"])',
        None,
    ),
    B(
        "np_heads_merged_in_reverse",
        "numpy_gpt2",
        "return linear(np.hstack(out_heads), **c_proj)",
        "return linear(np.hstack(out_heads[::-1]), **c_proj)",
        None,
    ),
    B(
        "np_attention_residual_missing",
        "numpy_gpt2",
        "x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)",
        "x = mha(layer_norm(x, **ln_1), **attn, n_head=n_head)",
        "residual",
    ),
    B(
        "np_mlp_norm_from_the_first_norm",
        "numpy_gpt2",
        "x = x + ffn(layer_norm(x, **ln_2), **mlp)",
        "x = x + ffn(layer_norm(x, **ln_1), **mlp)",
        None,
    ),
    B(
        "np_gelu_left_out",
        "numpy_gpt2",
        "return linear(gelu(linear(x, **c_fc)), **c_proj)",
        "return linear(linear(x, **c_fc), **c_proj)",
        None,
    ),
    B(
        "np_positions_shifted",
        "numpy_gpt2",
        "x = wte[ids] + wpe[np.arange(len(ids))]  # [T, D]",
        "x = wte[ids] + wpe[np.arange(1, len(ids) + 1)]  # [T, D]",
        None,
    ),
    B(
        "np_final_norm_left_out",
        "numpy_gpt2",
        "return layer_norm(x, **ln_f) @ wte.T  # [T, V]",
        "return x @ wte.T  # [T, V]",
        None,
    ),
    B(
        "np_batch_glue_first_sequence_each_time",
        "numpy_gpt2",
        "return np.stack([gpt2(ids, **params, n_head=n_head) for ids in token_ids])",
        "return np.stack([gpt2(token_ids[0], **params, n_head=n_head) for ids in token_ids])",
        None,
    ),
    # JAX GPT-2 on a pytree, jax.nn.dot_product_attention, blocks under jax.checkpoint
    B(
        "jax_gelu_erf",
        "jax_gpt2",
        'return dense(p["fc2"], jax.nn.gelu(dense(p["fc1"], x), approximate=True))',
        'return dense(p["fc2"], jax.nn.gelu(dense(p["fc1"], x), approximate=False))',
        "GELU",
    ),
    B(
        "jax_not_causal",
        "jax_gpt2",
        "out = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, N, H)",
        "out = jax.nn.dot_product_attention(q, k, v)  # (B, T, N, H)",
        "no mask applied",
    ),
    B(
        "jax_scale_one",
        "jax_gpt2",
        "out = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, N, H)",
        "out = jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=1.0)  # (B, T, N, H)",
        "scale",
    ),
    B(
        "jax_queries_keys_swapped_at_the_split",
        "jax_gpt2",
        "q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]",
        "k, q, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]",
        "operands swapped where they are split",
    ),
    B(
        "jax_heads_split_before_the_thirds",
        "jax_gpt2",
        'qkv = dense(p["qkv"], x).reshape(b, t, 3, num_heads, d // num_heads)  # (B, T, 3, N, H)',
        'qkv = dense(p["qkv"], x).reshape(b, t, num_heads, 3, d // num_heads).swapaxes(2, 3)',
        None,
    ),
    B(
        "jax_norm_mean_over_tokens",
        "jax_gpt2",
        "mean = x.mean(-1, keepdims=True)",
        "mean = x.mean(-2, keepdims=True)",
        None,
    ),
    B(
        "jax_attention_residual_missing",
        "jax_gpt2",
        'x = x + attention(p["attn"], norm(p["norm1"], x), num_heads)',
        'x = attention(p["attn"], norm(p["norm1"], x), num_heads)',
        "residual",
    ),
    B(
        "jax_positions_shifted",
        "jax_gpt2",
        'x = params["embed"]["tokens"][token_ids] + params["embed"]["positions"][:t]  # (B, T, D)',
        'x = params["embed"]["tokens"][token_ids] + params["embed"]["positions"][1 : t + 1]  # (B, T, D)',
        None,
    ),
    B(
        "jax_final_norm_left_out",
        "jax_gpt2",
        'return norm(params["norm_f"], x) @ params["embed"]["tokens"].T  # (B, T, V)',
        'return x @ params["embed"]["tokens"].T  # (B, T, V)',
        None,
    ),
    B(
        "jit_gelu_erf",
        "jax_gpt2_jit",
        'return dense(p["fc2"], jax.nn.gelu(dense(p["fc1"], x), approximate=True))',
        'return dense(p["fc2"], jax.nn.gelu(dense(p["fc1"], x), approximate=False))',
        "GELU",
    ),
    B(
        "jit_not_causal",
        "jax_gpt2_jit",
        "out = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, N, H)",
        "out = jax.nn.dot_product_attention(q, k, v)  # (B, T, N, H)",
        "no mask applied",
    ),
    B(
        "jit_mlp_residual_missing",
        "jax_gpt2_jit",
        'x = x + mlp(p["mlp"], norm(p["norm2"], x))',
        'x = mlp(p["mlp"], norm(p["norm2"], x))',
        "residual",
    ),
    # Flax NNX GPT-2 (against the user's minGPT-style torch GPT)
    B(
        "nnx_gelu_erf",
        "nnx_gpt2",
        "h = nnx.gelu(self.up(self.norm2(x)), approximate=True)",
        "h = nnx.gelu(self.up(self.norm2(x)), approximate=False)",
        "GELU",
    ),
    B(
        "nnx_mask_inverted",
        "nnx_gpt2",
        "scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)",
        "scores = jnp.where(mask, jnp.finfo(scores.dtype).min, scores)",
        "mask inverted",
    ),
    B(
        "nnx_scale_by_width",
        "nnx_gpt2",
        'scores = jnp.einsum("btnh,bsnh->bnts", q, k) / jnp.sqrt(h)  # (B, N, T, S)',
        'scores = jnp.einsum("btnh,bsnh->bnts", q, k) / jnp.sqrt(d)  # (B, N, T, S)',
        "scale",
    ),
    B(
        "nnx_queries_from_the_key_layer",
        "nnx_gpt2",
        "q = self.query(x).reshape(b, t, n, h)",
        "q = self.key(x).reshape(b, t, n, h)",
        "equals the reference's",
    ),
    B(
        "nnx_softmax_over_queries",
        "nnx_gpt2",
        "weights = jax.nn.softmax(scores, axis=-1)",
        "weights = jax.nn.softmax(scores, axis=-2)",
        "softmax over the wrong axis",
    ),
    B(
        "nnx_heads_merged_without_transpose",
        "nnx_gpt2",
        'context = jnp.einsum("bnts,bsnh->btnh", weights, v).reshape(b, t, d)',
        'context = jnp.einsum("bnts,bsnh->bnth", weights, v).reshape(b, t, d)',
        "another order",
    ),
    B(
        "nnx_attention_residual_missing",
        "nnx_gpt2",
        "x = x + self.attention(self.norm1(x))",
        "x = self.attention(self.norm1(x))",
        "residual",
    ),
    B(
        "nnx_positions_left_out",
        "nnx_gpt2",
        "x = self.tokens(token_ids) + self.positions(jnp.arange(t))",
        "x = self.tokens(token_ids) + self.positions(jnp.zeros(t, int))",
        None,
    ),
    B(
        "nnx_final_norm_left_out",
        "nnx_gpt2",
        "return self.tokens.attend(self.norm(x))  # tied head: x @ embedding.T",
        "return self.tokens.attend(x)  # tied head: x @ embedding.T",
        None,
    ),
    # Flax linen block: heads and batch by nested vmap, a chunked scan path
    B(
        "linen_scale_by_head_dim",
        "linen_block",
        "scores = q @ k.T / jnp.sqrt(h)  # (T, S)",
        "scores = q @ k.T / h  # (T, S)",
        "scale",
    ),
    B(
        "linen_mask_upper",
        "linen_block",
        "causal = jnp.tril(jnp.ones((t, t), dtype=bool))",
        "causal = jnp.triu(jnp.ones((t, t), dtype=bool))",
        "mask transposed",
    ),
    B(
        "linen_mask_hides_the_diagonal",
        "linen_block",
        "causal = jnp.tril(jnp.ones((t, t), dtype=bool))",
        "causal = jnp.tril(jnp.ones((t, t), dtype=bool), -1)",
        "off by one: the diagonal (each token itself) is hidden too",
    ),
    B(
        "linen_mask_inverted",
        "linen_block",
        "causal = jnp.tril(jnp.ones((t, t), dtype=bool))",
        "causal = ~jnp.tril(jnp.ones((t, t), dtype=bool))",
        "mask inverted",
    ),
    B(
        "linen_queries_keys_swapped",
        "linen_block",
        "q, k, v = (m.reshape(b, t, self.num_heads, h) for m in jnp.split(qkv, 3, axis=-1))",
        "k, q, v = (m.reshape(b, t, self.num_heads, h) for m in jnp.split(qkv, 3, axis=-1))",
        "operands swapped where they are split",
    ),
    B(
        "linen_values_from_the_queries",
        "linen_block",
        "context = jax.vmap(per_sequence)(q, k, v)  # over the batch: (B, T, N, H)",
        "context = jax.vmap(per_sequence)(q, k, q)  # over the batch: (B, T, N, H)",
        "another variable",
    ),
    B(
        "linen_attention_residual_missing",
        "linen_block",
        'x = x + nn.Dense(d, name="attn_proj")(context.reshape(b, t, d))',
        'x = nn.Dense(d, name="attn_proj")(context.reshape(b, t, d))',
        "residual",
    ),
    B(
        "linen_gelu_erf",
        "linen_block",
        'y = nn.gelu(nn.Dense(4 * d, name="c_fc")(y), approximate=True)',
        'y = nn.gelu(nn.Dense(4 * d, name="c_fc")(y), approximate=False)',
        "GELU",
    ),
    B(
        "chunk_mask_without_its_offset",
        "linen_block_chunked",
        "visible = (start + jnp.arange(chunk))[:, None] >= jnp.arange(t)[None, :]",
        "visible = jnp.arange(chunk)[:, None] >= jnp.arange(t)[None, :]",
        None,
    ),
    B(
        "chunk_softmax_over_queries",
        "linen_block_chunked",
        "return carry, jax.nn.softmax(scores, axis=-1) @ v",
        "return carry, jax.nn.softmax(scores, axis=0) @ v",
        None,
    ),
    B(
        "chunk_scale_left_out",
        "linen_block_chunked",
        "scores = rows @ k.T / jnp.sqrt(h)  # (C, S)",
        "scores = rows @ k.T  # (C, S)",
        "scale",
    ),
]
