"""RMSNorm, grouped-query attention and QK-norm: the book's bonus notebooks (ch05/07_gpt_to_llama,
ch05/11_qwen3).

The book's settings where its notebooks have one: RMSNorm on ``torch.randn(2, 3, 4)`` under seed 123
(converting-gpt-to-llama2.ipynb, which prints no values of it) and the shapes and weight count of
a ``GroupedQueryAttention`` of width 4096, 32 heads, 8 key/value groups (converting-llama2-to-llama3
.ipynb prints them; built here on torch's meta device and as Flax shapes, no weight drawn). The
steps of the layer are shown on a small config of this project's choosing: GroupedQueryAttention(
d_in=3, num_heads=4, num_kv_groups=2, head_dim=2, qk_norm=True) under ``torch.manual_seed(123)``
on the notes' sentence (two copies), RoPE base 10 000.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

import jax_attn
import numpy_attn
import torch_ref
from jax_attn import decoder_module
from jax_attn import grouped_query as jax_grouped_query
from jax_attn import ops as jax_ops
from numpy_attn import decoder_spec, ops
from numpy_attn import grouped_query as numpy_grouped_query
from parity_tests.lesson.code import excerpt, joined, three
from parity_tests.lesson.printed import PRINTED
from parity_tests.lesson.shown import shown
from parity_tests.notes import TOKENS, batch
from parity_tests.walkthrough import Shown
from torch_ref import decoders as torch_decoders

__all__ = [
    "BOOK_GQA",
    "SMALL_GQA",
    "book_gqa_shapes",
    "gqa",
    "keys_per_query_head",
    "mean_square",
    "weight_count",
]

BOOK_GQA = {"d_in": 4096, "num_heads": 32, "num_kv_groups": 8}  # converting-llama2-to-llama3.ipynb
SMALL_GQA = {"d_in": 3, "num_heads": 4, "num_kv_groups": 2, "head_dim": 2}  # this project's
SHOWN_WEIGHTS = ("W_key.weight", "W_value.weight", "W_query.weight")  # in the order the book prints
GQA = torch_decoders.GroupedQueryAttention
FORWARD = GQA.forward
FlaxGQA = decoder_module.GroupedQueryAttention
numpy_rms_norm = importlib.import_module("numpy_attn.rms_norm")  # numpy_attn.rms_norm is the function
_jax_rms_norm = jax.jit(jax_attn.rms_norm, static_argnames="eps")  # one program, not one per operation


def mean_square(x: Any) -> Any:
    """Each row's mean of squares, kept as a column: what RMSNorm divides by (its square root)."""
    return (x**2).mean(axis=-1, keepdims=True)


def weight_count(shapes: dict[str, tuple[int, ...]]) -> int:
    """The number of weights of a layer whose weights have ``shapes`` (the book sums ``p.numel()``)."""
    return sum(math.prod(shape) for shape in shapes.values())


def keys_per_query_head(xp: Any, keys: Any, num_heads: int) -> Any:
    """The key heads ``(B, G, S, H)`` as ``attend_groups`` pairs them with the query heads, copied
    out: its grouped queries ``(B, G, N/G, T, H)`` meet ``keys[:, :, None]`` ``(B, G, 1, S, H)``, so
    query head n meets key head n // (N/G). Returns ``(B, N, S, H)``; ``xp`` numpy or jax.numpy."""
    b, num_kv_groups, num_tokens, head_size = keys.shape
    group_size = num_heads // num_kv_groups
    grouped = xp.broadcast_to(keys[:, :, None], (b, num_kv_groups, group_size, num_tokens, head_size))
    return grouped.reshape(b, num_heads, num_tokens, head_size)  # (B, N, S, H)


def book_gqa_shapes() -> dict[str, dict[str, tuple[int, ...]]]:
    """The weight shapes of the book's GQA example, torch layout ``(out, in)``, in each framework:
    torch_ref's module on the meta device, numpy_attn's ``decoder_spec.gqa_shapes``, jax_attn's Flax
    module as shapes (``nnx.eval_shape``; Flax kernels are ``(in, out)``, transposed here)."""
    head_dim = BOOK_GQA["d_in"] // BOOK_GQA["num_heads"]
    with torch.device("meta"):
        module = GQA(**BOOK_GQA)
    flax_arguments = {"rope_base": 500_000.0, "rope_freq": None, "norm_eps": 1e-5, "norm_weight": "weight"}
    flax = nnx.eval_shape(
        lambda: FlaxGQA(*BOOK_GQA.values(), head_dim, False, **flax_arguments, rngs=nnx.Rngs(0))
    )
    params = nnx.state(flax, nnx.Param)
    return {
        "torch": {name: tuple(value.shape) for name, value in module.state_dict().items()},
        "numpy": decoder_spec.gqa_shapes(*BOOK_GQA.values(), head_dim, False),
        "jax": {
            f"{name}.weight": tuple(reversed(params[name]["kernel"].shape))
            for name in ("W_query", "W_key", "W_value", "out_proj")
        },
    }


def _small_traces() -> dict[str, Any]:
    """Every step of the small GroupedQueryAttention on the notes' batch, in each framework."""
    torch.manual_seed(123)
    module = GQA(**SMALL_GQA, qk_norm=True).eval()
    params = torch_ref.to_params(module)
    x = batch()  # (2, 6, 3)
    cos, sin = torch_ref.compute_rope_params(SMALL_GQA["head_dim"], 10_000.0, x.shape[1])
    heads = {name: SMALL_GQA[name] for name in ("num_heads", "num_kv_groups")}
    arguments = {**heads, "rope_base": 10_000.0, "norm_eps": 1e-6}  # GroupedQueryAttention's eps
    with torch.no_grad():
        torch_steps = module(torch.from_numpy(x), cos, sin, return_steps=True)[1]
    jax_params = {name: jnp.asarray(value) for name, value in params.items()}
    jax_steps = jax_attn.grouped_query_attention(jax_params, jnp.asarray(x), **arguments, return_steps=True)
    return {
        "torch": torch_steps,
        "numpy": numpy_attn.grouped_query_attention(params, x, **arguments, return_steps=True)[1],
        "jax": jax_steps[1],
    }


def _rms_norm_example() -> dict[str, Any]:
    """RMSNorm(emb_dim=4) of the book's ``torch.randn(2, 3, 4)`` under seed 123, eps 1e-5 (Llama's)."""
    torch.manual_seed(123)
    example_batch = torch.randn(2, 3, 4)
    weight = np.ones(4, np.float32)
    with torch.no_grad():
        expected = torch_ref.RMSNorm(4, eps=1e-5, weight_name="weight")(example_batch)
    x = example_batch.numpy()
    return {
        "torch": expected,
        "numpy": numpy_attn.rms_norm(x, weight, eps=1e-5),
        "jax": _jax_rms_norm(jnp.asarray(x), jnp.asarray(weight), eps=1e-5),
    }


def _grouped_code() -> dict[str, Any]:
    """The lines pairing query heads with key/value heads: torch's repeat_interleave, the others'
    grouped queries against one key head per group."""
    code = {"torch": excerpt(FORWARD, "keys = keys.repeat_interleave", "values = values.repeat_interleave")}
    for framework, module in (("numpy", numpy_grouped_query), ("jax", jax_grouped_query)):
        code[framework] = excerpt(module.attend_groups, "grouped =", "context_vec, steps =")
    return code


def _weights_code() -> dict[str, Any]:
    starts = ("self.W_query =", "self.W_key =", "self.W_value =", "self.out_proj =")
    return {
        "torch": excerpt(GQA.__init__, *starts),
        "numpy": excerpt(decoder_spec.gqa_shapes, "shapes = {"),
        "jax": excerpt(FlaxGQA.__init__, *starts),
    }


def _shape_table(shapes: dict[str, tuple[int, ...]]) -> np.ndarray:
    return np.array([shapes[name] for name in SHOWN_WEIGHTS], dtype=np.int64)


def gqa() -> list[Shown]:
    normed = _rms_norm_example()
    norm_lines = ("x_acc =", "variance =", "norm_x =", "return")
    shapes = book_gqa_shapes()
    steps = _small_traces()
    xp = {"numpy": np, "jax": jnp}
    shared = {"torch": steps["torch"]["keys_rope"].repeat_interleave(2, dim=1)}
    shared |= {f: keys_per_query_head(xp[f], steps[f]["keys_rope"], 4) for f in xp}
    attention_weights = excerpt(ops.scaled_dot_product_attention, "attn_weights = softmax")
    jax_weights = excerpt(jax_ops.scaled_dot_product_attention, "attn_weights = softmax")
    merged = {
        "torch": excerpt(
            FORWARD, "context_vec = (attn_weights", "context_vec = context_vec.reshape", "return record"
        ),
        "numpy": joined(
            excerpt(numpy_grouped_query.attend_groups, "return merge_heads"),
            excerpt(numpy_grouped_query.grouped_query_attention, "output ="),
        ),
        "jax": joined(
            excerpt(jax_grouped_query.attend_groups, "return merge_heads"),
            excerpt(jax_grouped_query.grouped_query_attention, "output ="),
        ),
    }
    return [
        shown(
            "RMSNorm(emb_dim=4) of torch.randn(2, 3, 4) under seed 123",
            three(
                (torch_decoders.RMSNorm.forward, *norm_lines),
                (numpy_rms_norm.rms_norm, *norm_lines),
            ),
            normed,
            note="converting-gpt-to-llama2.ipynb's example (eps 1e-5); unlike LayerNorm no mean is "
            "subtracted and there is no shift; weight ones until trained",
        ),
        shown(
            "its rows' mean of squares",
            {f: excerpt(mean_square, "return") for f in normed},
            {f: mean_square(v) for f, v in normed.items()},
            note="1 up to eps: x / sqrt(mean(x^2) + eps) has mean square mean(x^2) / (mean(x^2) + eps)",
        ),
        shown(
            "the book's GQA, d_in 4096, 32 heads, 8 key/value groups: W_key, W_value, W_query",
            _weights_code(),
            {f: _shape_table(s) for f, s in shapes.items()},
            PRINTED["gqa_shapes"],
            "(out, in): W_key and W_value project to 8 heads of 128, W_query to 32; "
            "Flax kernels are (in, out), transposed here",
        ),
        shown(
            "its number of weights",
            {f: excerpt(weight_count, "return") for f in shapes},
            {f: np.array(weight_count(s)) for f, s in shapes.items()},
            PRINTED["gqa_parameters"],
            "2 x 4096^2 + 2 x 1024 x 4096; the notebook's multi-head attention: 4 x 4096^2 = 67,108,864",
        ),
        shown(
            "small GQA: keys = W_key(x), 2 key/value heads of size 2, first sequence",
            three((FORWARD, "keys = self.W_key"), (numpy_grouped_query.grouped_query_attention, "keys =")),
            {f: s["keys"][0] for f, s in steps.items()},
            note="(B, S, G*H) = (2, 6, 4); queries (2, 6, 8): 4 heads. GroupedQueryAttention(d_in=3, "
            "num_heads=4, num_kv_groups=2, head_dim=2, qk_norm=True), seed 123, the notes' sentence",
        ),
        shown(
            "QK-norm (Qwen3): each key head RMS-normalised before RoPE, first sequence",
            three((FORWARD, "if self.q_norm is not None"), (numpy_grouped_query.rotated_heads, "if q_norm")),
            {f: s["k_norm"][0] for f, s in steps.items()},
            note="(G, S, H): each row's mean square is 1 up to eps (x1^2 + x2^2 about 2; 0.9998 where a "
            "head was small), queries alike; scale ones until trained",
        ),
        shown(
            "RoPE after the norm: key head 0, the tokens at positions 0-5",
            three(
                (FORWARD, "queries, keys = apply_rope"),
                (
                    numpy_grouped_query.rotated_heads,
                    "positions =",
                    "cos, sin =",
                    'steps["queries_rope"]',
                    'steps["keys_rope"]',
                ),
            ),
            {f: s["keys_rope"][0, 0] for f, s in steps.items()},
            note="head size 2: one pair, token t turned by t radians; each row keeps its length",
        ),
        shown(
            "key heads shared: (B, G, S, H) = (2, 2, 6, 2) read by 4 query heads, token 1",
            _grouped_code(),
            {f: value[0, :, 1] for f, value in shared.items()},
            note="(B, N, S, H) = (2, 4, 6, 2): query heads 0, 1 read key head 0 and 2, 3 key head 1 "
            "([K1, K1, K2, K2], repeat_interleave; repeat gives [K1, K2, K1, K2]); numpy_attn and "
            "jax_attn broadcast the G heads instead of copying them",
        ),
        shown(
            "attention weights of query heads 0 and 1 (both read key head 0), first sequence",
            {
                "torch": excerpt(FORWARD, "attn_weights = torch.softmax"),
                "numpy": joined(attention_weights, excerpt(numpy_grouped_query.attend_groups, "heads =")),
                "jax": joined(jax_weights, excerpt(jax_grouped_query.attend_groups, "heads =")),
            },
            {f: s["attn_weights"][0, :2] for f, s in steps.items()},
            note="(B, N, T, S): causal, scaled by sqrt(head_dim); different queries, the same keys",
            tokens=TOKENS,
        ),
        shown(
            "the 4 heads' context merged and projected: the output, first sequence",
            merged,
            {f: s["output"][0] for f, s in steps.items()},
            note="(B, T, D) = (2, 6, 3): out_proj maps N*H = 8 back to d_in = 3",
        ),
    ]
