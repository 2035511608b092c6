"""The RoPE, GQA and RMSNorm bug catalogue: two ports of grouped-query attention with rotary
position embeddings (``numpy_gqa_rope``, ``jax_gqa_rope``), checked against torch_ref's
``GroupedQueryAttention``, and bugs planted in them one line at a time (``catalogue.Bug``)."""

from __future__ import annotations

import numpy as np

from tests.ports.catalogue import HERE, Bug, load

D_IN, NUM_HEADS, NUM_KV_GROUPS, HEAD_DIM, CONTEXT, BATCH = 16, 4, 2, 4, 16, 2
ROPE_BASE = 500_000.0
PORTS = {"numpy_gqa_rope": "gqa", "jax_gqa_rope": "attention"}


def reference(qk_norm: bool = False):
    """torch_ref's GroupedQueryAttention on x alone: the RoPE tables computed in its forward (so a
    port's own positions and frequencies are compared with the reference's), random norm weights."""
    import torch

    from torch_ref import GroupedQueryAttention, compute_rope_params

    class RopeAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.att = GroupedQueryAttention(D_IN, NUM_HEADS, NUM_KV_GROUPS, HEAD_DIM, qk_norm)

        def forward(self, x):
            cos, sin = compute_rope_params(HEAD_DIM, ROPE_BASE, x.shape[1])
            return self.att(x, cos, sin)

    torch.manual_seed(0)
    module = RopeAttention()
    if qk_norm:
        with torch.no_grad():
            for norm in (module.att.q_norm, module.att.k_norm):
                norm.scale.copy_(0.5 + torch.rand(HEAD_DIM))
    return module


def inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, CONTEXT, D_IN)).astype(np.float32)


def candidate(port: str, source: str | None = None, directory=None):
    module = load(port, source if source is not None else (HERE / f"{port}.py").read_text(), directory)
    return getattr(module, PORTS[port])


B = Bug
BUGS = [  # (bug, whether the reference has QK-norm)
    # NumPy: rope() by halves written in place, frequencies and positions of its own
    (
        B(
            "np_rope_interleaved_pairs",
            "numpy_gqa_rope",
            "x1, x2 = x[..., :half], x[..., half:]",
            "x1, x2 = x[..., 0::2], x[..., 1::2]",
        ),
        False,
    ),
    (
        B(
            "np_rope_base_10000",
            "numpy_gqa_rope",
            "inv_freq = 1.0 / 500_000.0 ** (np.arange(0, hd, 2) / hd)",
            "inv_freq = 1.0 / 10_000.0 ** (np.arange(0, hd, 2) / hd)",
        ),
        False,
    ),
    (
        B(
            "np_rope_query_positions_from_one",
            "numpy_gqa_rope",
            "q_pos = np.arange(t, dtype=np.float32)  # queries' positions (a cache adds its length)",
            "q_pos = np.arange(1, t + 1, dtype=np.float32)",
        ),
        False,
    ),
    (
        B(
            "np_rope_on_values_too",
            "numpy_gqa_rope",
            "k = rope(k, k_pos[:, None] * inv_freq[None, :])",
            "k, v = rope(k, k_pos[:, None] * inv_freq[None, :]), rope(v, k_pos[:, None] * inv_freq[None, :])",
        ),
        False,
    ),
    (
        B(
            "np_rope_missing_on_keys",
            "numpy_gqa_rope",
            "k = rope(k, k_pos[:, None] * inv_freq[None, :])",
            "pass  # the rotation of the keys left out",
        ),
        False,
    ),
    (
        B(
            "np_kv_heads_tiled",
            "numpy_gqa_rope",
            "k = np.repeat(k, num_heads // num_groups, axis=1)",
            "k = np.tile(k, (1, num_heads // num_groups, 1, 1))",
        ),
        False,
    ),
    (
        B(
            "np_rms_norm_eps",
            "numpy_gqa_rope",
            "return x / np.sqrt(ms + 1e-6) * w",
            "return x / np.sqrt(ms + 1e-5) * w",
        ),
        True,
    ),
    (
        B(
            "np_rms_norm_one_plus_weight",
            "numpy_gqa_rope",
            "return x / np.sqrt(ms + 1e-6) * w",
            "return x / np.sqrt(ms + 1e-6) * (1 + w)",
        ),
        True,
    ),
    # JAX: rotate_half, the tables of both halves, jnp.repeat
    (
        B(
            "jax_rope_interleaved_pairs",
            "jax_gqa_rope",
            "x1, x2 = jnp.split(x, 2, axis=-1)",
            "x1, x2 = x[..., 0::2], x[..., 1::2]",
        ),
        False,
    ),
    (
        B(
            "jax_rope_base_10000",
            "jax_gqa_rope",
            "freqs = 1.0 / (500_000.0 ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))",
            "freqs = 1.0 / (10_000.0 ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))",
        ),
        False,
    ),
    (
        B(
            "jax_rope_positions_from_one",
            "jax_gqa_rope",
            "pos = jnp.arange(seq, dtype=jnp.float32)",
            "pos = jnp.arange(1, seq + 1, dtype=jnp.float32)",
        ),
        False,
    ),
    (
        B(
            "jax_rope_on_values_too",
            "jax_gqa_rope",
            "keys = keys * cos + rotate_half(keys) * sin",
            "keys, values = keys * cos + rotate_half(keys) * sin, values * cos + rotate_half(values) * sin",
        ),
        False,
    ),
    (
        B(
            "jax_rope_missing_on_keys",
            "jax_gqa_rope",
            "keys = keys * cos + rotate_half(keys) * sin",
            "pass  # the rotation of the keys left out",
        ),
        False,
    ),
    (
        B(
            "jax_kv_heads_tiled",
            "jax_gqa_rope",
            "keys = jnp.repeat(keys, n_heads // n_kv, axis=1)",
            "keys = jnp.tile(keys, (1, n_heads // n_kv, 1, 1))",
        ),
        False,
    ),
    (
        B(
            "jax_rms_norm_eps",
            "jax_gqa_rope",
            "return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * weight",
            "return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-5) * weight",
        ),
        True,
    ),
    (
        B(
            "jax_rms_norm_one_plus_weight",
            "jax_gqa_rope",
            "return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * weight",
            "return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * (1 + weight)",
        ),
        True,
    ),
]
