"""Run the benchmark: round-robin timing in one process, memory in fresh processes, decoding.

Timings are medians over rounds; in each round every implementation runs once, one after the
other, so that slow drifts of a shared machine hit all of them alike. Every implementation runs
once before the first round (JIT compilation, caches). The float32 GEMM peak is measured in the
same run, so "% of peak" compares like with like.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from numpy_attn.fast.options import AUTO_BLOCKWISE_TOKENS, uses_blockwise
from parity_tests.bench.implementations import (
    IMPLEMENTATIONS,
    SHAPES,
    Shape,
    layer_flops,
    make_call,
    make_inputs,
)

__all__ = ["MEMORY_LIMIT_BYTES", "decode_speed", "gemm_peak", "run_benchmark", "skip_reason"]

MEMORY_LIMIT_BYTES = 24 * 2**30  # this machine's memory: T x T implementations beyond it are skipped
TINY_CALLS = 200  # calls per sample where one call takes microseconds


def gemm_peak(size: int = 4096, rounds: int = 5) -> float:
    """float32 GEMM throughput of NumPy's BLAS in GFLOP/s (median of ``rounds``)."""
    a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    a @ a
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        a @ a
        samples.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(samples) / 1e9


def skip_reason(name: str, shape: Shape) -> str | None:
    """Why ``name`` is not run at ``shape``, or None: a (T, S) float32 matrix per head and batch,
    three of them alive at once, must fit; an ``*_auto`` row that would run the blockwise path
    again is left to the blockwise row."""
    if (
        IMPLEMENTATIONS[name][1]
        and 3 * 4 * shape.batch * shape.num_heads * shape.tokens**2 > MEMORY_LIMIT_BYTES
    ):
        return "a (T, T) matrix per head needs more than this machine's 24 GiB"
    if name.endswith("_auto") and uses_blockwise("auto", shape.tokens):
        return f"auto runs the blockwise path from {AUTO_BLOCKWISE_TOKENS} query tokens on (its row)"
    return None


def _time(call: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def _extra_memory(name: str, shape: str) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "parity_tests.bench.memory", name, shape],
        capture_output=True, text=True, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])["extra_bytes"]


def decode_speed(framework: str, tokens: int = 1024, steps: int = 16, rounds: int = 3) -> dict[str, Any]:
    """Tokens/s of KV-cache decoding at position ``tokens`` versus recomputing the whole prefix
    (the fastest layer path) for every new token; MultiHeadAttention, d=768, 12 heads, B=1."""
    shape = Shape("decode", 1, tokens + steps, 768, 768, 12)
    params, x = make_inputs(shape)
    kwargs = {"num_heads": 12, "context_length": tokens + steps}
    if framework == "numpy":
        import numpy_attn as package

        decode = functools.partial(package.multi_head_attention_decode, **kwargs)
        layer = functools.partial(package.multi_head_attention, **kwargs, implementation="auto")
        ready = lambda value: value  # noqa: E731
    else:
        import jax

        import jax_attn as package

        decode = jax.jit(functools.partial(package.multi_head_attention_decode, **kwargs))
        layer = jax.jit(functools.partial(package.multi_head_attention, **kwargs, implementation="auto"))
        ready = jax.block_until_ready
    cached, recomputed = [], []
    for _ in range(rounds + 1):  # the first round warms up
        cache = package.init_kv_cache(1, 12, tokens + steps, 64)
        _, cache = decode(params, x[:, :tokens], cache)
        ready(cache.keys)
        start = time.perf_counter()
        for t in range(tokens, tokens + steps):
            output, cache = decode(params, x[:, t : t + 1], cache)
        ready(output)
        cached.append((time.perf_counter() - start) / steps)
        start = time.perf_counter()
        ready(layer(params, x[:, : tokens + 1]))
        recomputed.append(time.perf_counter() - start)
    cached_s, recomputed_s = statistics.median(cached[1:]), statistics.median(recomputed[1:])
    return {
        "framework": framework,
        "tokens": tokens,
        "cached_tokens_per_s": 1 / cached_s,
        "recompute_tokens_per_s": 1 / recomputed_s,
        "speedup": recomputed_s / cached_s,
    }


def run_benchmark(
    shapes: list[str],
    implementations: list[str],
    rounds: int = 5,
    memory: bool = True,
    decode: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Everything the README table and the chart are made of, as one JSON-ready dict. Every time
    is also given relative to torch SDPA's at the same shape: ``torch_sdpa`` is timed (first)
    when ``implementations`` leaves it out."""
    import jax
    import torch

    if "torch_sdpa" not in implementations:  # the baseline of the table's ratios and of the chart
        implementations = ["torch_sdpa", *implementations]

    peak = gemm_peak()
    results = []
    for shape_name in shapes:
        shape = SHAPES[shape_name]
        params, x = make_inputs(shape)
        names = [n for n in implementations if skip_reason(n, shape) is None]
        calls = {}
        for name in names:
            progress(f"{shape_name}: warming up {name}")
            calls[name] = make_call(name, shape, params, x)
            calls[name]()
        inner = TINY_CALLS if shape.tokens < 64 else 1
        samples: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(rounds):
            for name in names:
                progress(f"{shape_name}: round {round_ + 1}/{rounds}, {name}")
                samples[name].append(_time(calls[name], inner))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        for name in implementations:
            row: dict[str, Any] = {"shape": shape_name, "implementation": name}
            if name not in medians:
                row["skipped"] = skip_reason(name, shape)
                results.append(row)
                continue
            seconds = medians[name]
            gflops = layer_flops(shape) / seconds / 1e9
            row |= {
                "median_s": seconds,
                "samples_s": samples[name],
                "gflops": gflops,
                "pct_of_gemm_peak": 100 * gflops / peak,
                "ratio_to_torch_sdpa": seconds / medians["torch_sdpa"],
            }
            if memory and shape.tokens >= 64:
                progress(f"{shape_name}: memory of {name} (fresh process)")
                row["extra_memory_bytes"] = _extra_memory(name, shape_name)
            results.append(row)
    return {
        "command": "attn-parity bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "jax": jax.__version__,
        },
        "dtype": "float32",
        "layer": "MultiHeadAttention (causal), d_in = d_out, heads as in each shape",
        "rounds": rounds,
        "gemm_peak_gflops": peak,
        "results": results,
        "decode": [decode_speed(framework) for framework in ("numpy", "jax")] if decode else [],
    }
