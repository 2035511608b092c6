"""The public functions numpy_attn and jax_attn share, declared once.

The layers of the notes come from ``numpy_attn.spec.SPECS`` (each spec names the module of its
math); ``PUBLIC`` lists everything else: the module of each package that holds its math (or, for
the framework-neutral fast paths, the one shared module), the checks module whose function of
the same name its door runs, and the door's options. Each package's ``__init__`` calls
``export(FRAMEWORK, package)``, which puts that package's math behind ``numpy_attn.door``: the two
packages cannot export different functions, or the same function with different checks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from numpy_attn import cache_checks, calls, decoder_checks, door, generation_checks, gpt_checks
from numpy_attn.spec import SPECS


@dataclass(frozen=True)
class Public:
    """One public function: ``module`` holds its math (a module of each package, or a dotted path to
    one shared framework-neutral module), ``checks`` the module whose function of the same name is
    its door's check, ``steps`` whether it takes ``return_steps``, ``static`` its arguments that are
    static under ``jax.jit`` (given, an eager jax_attn call runs as the program ``jax.jit`` compiles:
    a block, a model, a decoding step)."""

    module: str
    checks: Any  # a module
    steps: bool = False
    static: tuple[str, ...] | None = None


FAST = "numpy_attn.fast.attend"
PROJECTIONS = "numpy_attn.fast.projections"
BLOCKWISE = ("causal", "dropout", "block_size")  # static: an eager call runs one compiled program
GQA_STATIC = ("num_heads", "num_kv_groups", "rope_base", "rope_freq", "norm_eps")
PUBLIC: dict[str, Public] = {
    "simplified_self_attention": Public("simplified", calls, steps=True),
    # the building blocks
    **dict.fromkeys(
        ("softmax", "softmax_naive", "causal_mask", "dropout", "linear", "split_heads", "merge_heads"),
        Public("ops", calls),
    ),
    "scaled_dot_product_attention": Public("ops", calls, steps=True),
    # the fast paths
    "attend": Public(FAST, calls),
    "attend_heads": Public(FAST, calls),
    "blockwise_attention": Public("fast.blockwise", calls, static=BLOCKWISE),
    "blockwise_self_attention": Public("fast.blockwise", calls, static=("num_heads", *BLOCKWISE)),
    **dict.fromkeys(("qkv_projections", "qkv_weights", "split_projection"), Public(PROJECTIONS, calls)),
    # decoding with a KV cache
    "init_kv_cache": Public("kv_cache", cache_checks),
    "multi_head_attention_decode": Public("kv_cache", cache_checks, static=("num_heads", "context_length")),
    "fused_causal_attention_decode": Public("kv_cache", cache_checks, static=("num_heads", "context_size")),
    # the book's GPT (chapter 4)
    **dict.fromkeys(("layer_norm", "gelu", "feed_forward"), Public("gpt", gpt_checks)),
    "transformer_block": Public(
        "gpt", gpt_checks, steps=True, static=("num_heads", "context_length", "dropout_rate")
    ),
    "gpt_model": Public("gpt", gpt_checks, steps=True, static=("config",)),
    "init_gpt_cache": Public("gpt", gpt_checks),
    "gpt_model_decode": Public("gpt", gpt_checks, static=("config",)),
    "generate": Public("generation", generation_checks),  # every model: the GPT, Llama 3, Qwen3
    # the book's Llama 3 and Qwen3 (numpy_attn.decoder_spec)
    "rms_norm": Public("rms_norm", decoder_checks),
    "rope": Public("rope", decoder_checks),
    "swiglu_feed_forward": Public("decoders", decoder_checks),
    "grouped_query_attention": Public("grouped_query", decoder_checks, steps=True, static=GQA_STATIC),
    "grouped_query_attention_decode": Public("grouped_query", decoder_checks, static=GQA_STATIC),
    "llama3_model": Public("decoders", decoder_checks, steps=True, static=("cfg",)),
    "qwen3_model": Public("decoders", decoder_checks, steps=True, static=("cfg",)),
    "init_decoder_cache": Public("decoders", decoder_checks),
    "llama3_model_decode": Public("decoders", decoder_checks, static=("cfg",)),
    "qwen3_model_decode": Public("decoders", decoder_checks, static=("cfg",)),
}


# the names every package exports: the layers of the notes, then PUBLIC's
NAMES = [*(spec.function for spec in SPECS.values()), *PUBLIC]


def export(
    framework: door.Framework, package: str, checks: Mapping[str, Callable[..., None]] = {}
) -> dict[str, Any]:
    """Every shared public function of ``package`` (``"numpy_attn"``, ``"jax_attn"``), its math
    behind the door of ``framework``; ``checks`` replace a row's check (jax_attn's ``generate``
    takes a model). Returns name -> function."""
    public: dict[str, Any] = {}
    for spec in SPECS.values():
        math = getattr(importlib.import_module(f"{package}.{spec.module}"), spec.function)
        public[spec.function] = door.layer(spec, framework, math)
    for name, row in PUBLIC.items():
        shared = row.module.startswith("numpy_attn.")
        math = getattr(importlib.import_module(row.module if shared else f"{package}.{row.module}"), name)
        check = checks.get(name, getattr(row.checks, name))
        public[name] = door.block(
            math, check, framework, steps=row.steps, framework_first=shared, static=row.static
        )
    return public
