"""Where the time of the causal layer goes, stage by stage, in torch (SDPA), NumPy and JAX.

    python -m parity_tests.bench.profile [--shape S ...] [--rounds N]

prints a markdown table: per framework and stage (the fused QKV projection, the attention core,
the output projection, and the whole layer on its fastest path), the median wall time over
round-robin rounds, GFLOP/s and % of the float32 GEMM peak measured in the same process, and
the cores used (CPU time / wall time). The cores are torch's scaled_dot_product_attention,
``numpy_attn.blockwise_attention`` and ``jax_attn.blockwise_attention`` (jitted) on heads split
from the projections; the JAX stages are jitted one by one.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from numpy_attn import qkv_weights
from parity_tests.bench.implementations import SHAPES, Shape, layer_flops, make_call, make_inputs
from parity_tests.bench.output import format_time
from parity_tests.bench.run import gemm_peak
from parity_tests.usage import integer, script_parser

__all__ = ["STAGES", "markdown_profile", "profile_stages"]

STAGES = ("QKV projection", "attention core", "output projection", "whole layer")


def _stage_flops(shape: Shape) -> dict[str, float]:
    b, t, d, e = shape.batch, shape.tokens, shape.d_in, shape.d_out
    return {
        "QKV projection": 2.0 * b * t * d * 3 * e,
        "attention core": 2.0 * b * t * t * e,  # QK^T and weights @ V over the causal half
        "output projection": 2.0 * b * t * e * e,
        "whole layer": layer_flops(shape),
    }


def _torch_stages(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> dict[str, Callable[[], Any]]:
    import torch
    import torch.nn.functional as F

    b, t, n, h = shape.batch, shape.tokens, shape.num_heads, shape.d_out // shape.num_heads
    weight = torch.from_numpy(qkv_weights(params)[0])  # (3E, D)
    out_weight, out_bias = (
        torch.from_numpy(params["out_proj.weight"]),
        torch.from_numpy(params["out_proj.bias"]),
    )
    x_tensor = torch.from_numpy(x)
    projected = F.linear(x_tensor, weight)
    heads = [m.reshape(b, t, n, h).transpose(1, 2) for m in projected.split(shape.d_out, dim=-1)]
    context = F.scaled_dot_product_attention(*heads, is_causal=True).transpose(1, 2).reshape(b, t, n * h)
    return {
        "QKV projection": torch.no_grad()(lambda: F.linear(x_tensor, weight)),
        "attention core": torch.no_grad()(lambda: F.scaled_dot_product_attention(*heads, is_causal=True)),
        "output projection": torch.no_grad()(lambda: F.linear(context, out_weight, out_bias)),
        "whole layer": make_call("torch_sdpa", shape, params, x),
    }


def _numpy_stages(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> dict[str, Callable[[], Any]]:
    import numpy_attn

    weight, _ = numpy_attn.qkv_weights(params)
    heads = [numpy_attn.split_heads(p, shape.num_heads) for p in numpy_attn.split_projection(x, weight)]
    context = numpy_attn.merge_heads(numpy_attn.blockwise_attention(*heads, causal=True))
    return {
        "QKV projection": lambda: numpy_attn.linear(x, weight),
        "attention core": lambda: numpy_attn.blockwise_attention(*heads, causal=True),
        "output projection": lambda: numpy_attn.linear(
            context, params["out_proj.weight"], params["out_proj.bias"]
        ),
        "whole layer": make_call("numpy_blockwise", shape, params, x),
    }


def _jax_stages(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> dict[str, Callable[[], Any]]:
    import jax
    import jax.numpy as jnp

    import jax_attn

    weight, _ = jax_attn.qkv_weights({k: jnp.asarray(v) for k, v in params.items()})
    jax_x = jnp.asarray(x)
    linear = jax.jit(jax_attn.linear)
    core = jax.jit(functools.partial(jax_attn.blockwise_attention, causal=True))
    heads = [jax_attn.split_heads(p, shape.num_heads) for p in jax_attn.split_projection(jax_x, weight)]
    context = jax_attn.merge_heads(core(*heads))
    out_weight, out_bias = jnp.asarray(params["out_proj.weight"]), jnp.asarray(params["out_proj.bias"])
    return {
        "QKV projection": lambda: linear(jax_x, weight).block_until_ready(),
        "attention core": lambda: core(*heads).block_until_ready(),
        "output projection": lambda: linear(context, out_weight, out_bias).block_until_ready(),
        "whole layer": make_call("jax_blockwise", shape, params, x),
    }


FRAMEWORKS = {"torch": _torch_stages, "numpy": _numpy_stages, "jax": _jax_stages}


def profile_stages(shape_name: str, rounds: int = 3) -> list[dict[str, Any]]:
    """One row per framework and stage: median seconds, GFLOP/s, % of GEMM peak, cores used."""
    shape = SHAPES[shape_name]
    params, x = make_inputs(shape)
    calls = {
        (f, stage): call
        for f, stages in FRAMEWORKS.items()
        for stage, call in stages(shape, params, x).items()
    }
    for call in calls.values():
        call()  # compile, warm caches
    peak = gemm_peak()
    wall: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            wall[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
    flops = _stage_flops(shape)
    rows = []
    for (framework, stage), samples in wall.items():
        seconds = statistics.median(samples)
        gflops = flops[stage] / seconds / 1e9
        rows.append({
            "shape": shape_name, "framework": framework, "stage": stage, "median_s": seconds,
            "gflops": gflops, "pct_of_gemm_peak": 100 * gflops / peak,
            "cores_used": sum(cpu[framework, stage]) / sum(samples), "gemm_peak_gflops": peak,
        })  # fmt: skip
    return rows


def markdown_profile(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| shape | framework | stage | time | GFLOP/s | % of GEMM peak | cores used |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['shape']} | {row['framework']} | {row['stage']} | {format_time(row['median_s'])} | "
            f"{row['gflops']:.1f} | {row['pct_of_gemm_peak']:.0f} % | {row['cores_used']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = script_parser("parity_tests.bench.profile", __doc__)
    parser.add_argument("--shape", nargs="+", default=["B8_T1024", "B1_T4096"], choices=list(SHAPES))
    parser.add_argument(
        "--rounds", type=integer("--rounds", 1, 1000), default=3, help="round-robin rounds (medians)"
    )
    args = parser.parse_args(argv)
    for shape in args.shape:  # one table per shape, printed as soon as it is measured
        rows = profile_stages(shape, args.rounds)
        print(f"{shape}: float32 GEMM peak in the same process {rows[0]['gemm_peak_gflops']:.0f} GFLOP/s")
        print(markdown_profile(rows), flush=True)


if __name__ == "__main__":
    main()
