"""The implementations the benchmark compares, all on the same weights and input.

The layer is the book's causal ``MultiHeadAttention`` (bias-free projections, ``out_proj`` with
bias); every implementation computes it from the same torch-format weights. Each factory imports
only its own framework, so that a memory run in a fresh process measures that framework alone.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["IMPLEMENTATIONS", "SHAPES", "Shape", "layer_flops", "make_call", "make_inputs"]


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    tokens: int
    d_in: int
    d_out: int
    num_heads: int


SHAPES = {
    shape.name: shape
    for shape in [
        Shape("B8_T1024", 8, 1024, 768, 768, 12),
        Shape("B1_T4096", 1, 4096, 768, 768, 12),
        Shape("B1_T16384", 1, 16384, 768, 768, 12),
        Shape("B2_T6_d3to4", 2, 6, 3, 4, 2),
    ]
}

# implementation -> (framework, materialises a (T, S) matrix per head)
IMPLEMENTATIONS: dict[str, tuple[str, bool]] = {
    "torch_ref": ("torch", True),
    "torch_sdpa": ("torch", False),
    "numpy_reference": ("numpy", True),
    "numpy_blockwise": ("numpy", False),
    "numpy_auto": ("numpy", False),  # the reference core below 512 tokens, blockwise from there
    # blockwise, its loop's heads on a thread per core, BLAS one thread per call (numpy_attn.threads)
    "numpy_blockwise_threads": ("numpy", False),
    "jax_reference": ("jax", True),
    "jax_blockwise": ("jax", False),
    "jax_auto": ("jax", False),
    "jax_nn_dot_product_attention": ("jax", True),
}


def layer_flops(shape: Shape) -> float:
    """Floating-point operations of the causal layer: projections, output projection, and the
    two attention products over the causal half (QK^T and weights @ V)."""
    b, t, d, e = shape.batch, shape.tokens, shape.d_in, shape.d_out
    projections = 2 * b * t * d * 3 * e + 2 * b * t * e * e
    attention = 2 * b * t * t * e  # 2 * (B N T^2 H) for each product, halved by causality
    return float(projections + attention)


def make_inputs(shape: Shape, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Torch-format weights (uniform as torch's nn.Linear) and a standard-normal input, float32."""
    rng = np.random.default_rng(seed)
    bound_in, bound_out = 1 / np.sqrt(shape.d_in), 1 / np.sqrt(shape.d_out)
    params = {
        f"{name}.weight": rng.uniform(-bound_in, bound_in, (shape.d_out, shape.d_in)).astype(np.float32)
        for name in ("W_query", "W_key", "W_value")
    }
    params["out_proj.weight"] = rng.uniform(-bound_out, bound_out, (shape.d_out, shape.d_out)).astype(
        np.float32
    )
    params["out_proj.bias"] = rng.uniform(-bound_out, bound_out, shape.d_out).astype(np.float32)
    x = rng.standard_normal((shape.batch, shape.tokens, shape.d_in)).astype(np.float32)
    return params, x


def make_call(name: str, shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> Callable[[], Any]:
    """A no-argument callable running implementation ``name`` once (results ready on return)."""
    framework = IMPLEMENTATIONS[name][0]
    kwargs = {"num_heads": shape.num_heads, "context_length": shape.tokens}
    if framework == "numpy":
        return _numpy_call(name, params, x, kwargs)
    if framework == "torch":
        return _torch_call(name, shape, params, x)
    return _jax_call(name, shape, params, x, kwargs)


def _numpy_call(
    name: str, params: dict[str, np.ndarray], x: np.ndarray, kwargs: dict[str, int]
) -> Callable[[], Any]:
    import numpy_attn

    if name != "numpy_blockwise_threads":
        implementation = name.removeprefix("numpy_")
        return lambda: numpy_attn.multi_head_attention(params, x, **kwargs, implementation=implementation)
    from threadpoolctl import ThreadpoolController

    blas = ThreadpoolController()  # finds the BLAS libraries once, not on every call

    def heads_on_threads() -> np.ndarray:
        with numpy_attn.parallel_heads(os.cpu_count() or 1, lambda: blas.limit(limits=1, user_api="blas")):
            return numpy_attn.multi_head_attention(params, x, **kwargs, implementation="blockwise")

    return heads_on_threads


def _torch_call(name: str, shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F

    import torch_ref

    module = torch_ref.MultiHeadAttention(shape.d_in, shape.d_out, shape.tokens, 0.0, shape.num_heads)
    torch_ref.load_params(module.eval(), params)
    x_tensor = torch.from_numpy(x)
    if name == "torch_ref":
        return torch.no_grad()(lambda: module(x_tensor))
    b, t, n, h = shape.batch, shape.tokens, shape.num_heads, shape.d_out // shape.num_heads
    weight = torch.cat([module.W_query.weight, module.W_key.weight, module.W_value.weight]).detach()

    @torch.no_grad()
    def sdpa() -> torch.Tensor:
        queries, keys, values = F.linear(x_tensor, weight).split(shape.d_out, dim=-1)
        heads = [m.view(b, t, n, h).transpose(1, 2) for m in (queries, keys, values)]
        context = F.scaled_dot_product_attention(*heads, is_causal=True)
        return module.out_proj(context.transpose(1, 2).reshape(b, t, n * h))

    return sdpa


def _jax_call(
    name: str, shape: Shape, params: dict[str, np.ndarray], x: np.ndarray, kwargs: dict[str, int]
) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp

    import jax_attn

    jax_params = {k: jnp.asarray(v) for k, v in params.items()}
    jax_x = jnp.asarray(x)
    if name == "jax_nn_dot_product_attention":
        b, t, n, h = shape.batch, shape.tokens, shape.num_heads, shape.d_out // shape.num_heads

        def layer(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
            queries, keys, values = jax_attn.qkv_projections(x, params, fused=True)
            heads = [m.reshape(b, t, n, h) for m in (queries, keys, values)]  # (B, T, N, H)
            context = jax.nn.dot_product_attention(*heads, is_causal=True).reshape(b, t, n * h)
            return jax_attn.linear(context, params["out_proj.weight"], params["out_proj.bias"])

        call = jax.jit(layer)
    else:
        implementation = name.removeprefix("jax_")
        call = jax.jit(
            functools.partial(jax_attn.multi_head_attention, **kwargs, implementation=implementation)
        )
    return lambda: call(jax_params, jax_x).block_until_ready()
