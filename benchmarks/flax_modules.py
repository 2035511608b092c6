"""Each Flax NNX module's jitted call against the jax_attn function it wraps, in one process.

    PYTHONPATH=. python benchmarks/flax_modules.py --out benchmarks/flax_modules.md

Every layer is built fresh (``jax_attn.<Class>(..., rngs=nnx.Rngs(0))``, eval mode) and its
weights handed to the function (``module.to_params()``), so both compute the same layer. Three
calls are timed round-robin in every round: the function under ``jax.jit`` (the layer's
constructor arguments static), the module under ``jax.jit`` of ``nnx.merge`` (``nnx.split``
once: the functional pattern Flax's performance guide recommends for hot loops, as it keeps
``nnx.jit``'s per-call walk of the module graph out of the loop), and the module under
``nnx.jit``. A round times ``--calls`` calls of each (the order rotating from round to round);
the table gives the median time per call and the median (and quartiles) of the per-round ratios
module / function (below 1: the module is faster), whether XLA compiled the two to the same
kernels (``parity_tests.bench.hlo``; else the kernels only one runs) and the ratio of the FLOPs
that XLA's cost analysis counts. A second table times each way of calling a module on a tiny
input, where the per-call overhead is all there is. The two-dimensional classes (V1, V2) take
one ``(T, D)`` sequence, the others ``(B, T, D)``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_attn
from parity_tests.bench.hlo import kernel_difference, kernels


def constructors(width: int, heads: int, tokens: int) -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """Layer -> (constructor arguments, function keyword arguments): width D in and out,
    ``heads`` heads (the wrapper: ``heads`` heads of width D / heads), no dropout."""
    causal = {"context_length": tokens, "dropout": 0.0}
    return {
        "SelfAttentionV1": ((width, width), {}),
        "SelfAttentionV2": ((width, width), {}),
        "CausalAttention": ((width, width, tokens, 0.0), causal),
        "MultiHeadAttentionWrapper": (
            (width, width // heads, tokens, 0.0, heads), {"num_heads": heads, **causal}
        ),
        "MultiHeadAttention": ((width, width, tokens, 0.0, heads), {"num_heads": heads, **causal}),
        "FusedSingleHeadAttention": ((width,), {}),
        "FusedMultiHeadAttention": ((width, heads), {"num_heads": heads}),
        "FusedCausalAttention": (
            (width, heads, tokens, 0.0, 0.0), {"num_heads": heads, "context_size": tokens,
                                               "attn_drop": 0.0, "out_drop": 0.0}
        ),
    }  # fmt: skip


SPLIT, NNX_JIT, FUNCTION_CALL = "module (jax.jit of nnx.merge)", "module (nnx.jit)", "function (jax.jit)"


def calls_of(
    layer: str, args: tuple[Any, ...], kwargs: dict[str, Any], x: jax.Array, implementation: str
) -> tuple[dict[str, Callable[[], jax.Array]], str, float]:
    """The three calls; the kernels XLA compiled the module to that the function's program does
    not have, or the other way round (``"same"``: none); the ratio of XLA's estimated FLOPs,
    module / function (1.0: the same arithmetic)."""
    module = getattr(jax_attn, layer)(*args, implementation=implementation, rngs=nnx.Rngs(0))
    module.eval()
    params = {name: jnp.asarray(value) for name, value in module.to_params().items()}
    function = jax.jit(
        functools.partial(getattr(jax_attn, FUNCTION[layer]), **kwargs, implementation=implementation)
    )
    nnx_jitted = nnx.jit(lambda m, x: m(x))
    graphdef, state = nnx.split(module)
    split_jitted = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
    calls = {
        FUNCTION_CALL: lambda: function(params, x),
        SPLIT: lambda: split_jitted(state, x),
        NNX_JIT: lambda: nnx_jitted(module, x),
    }
    module_program = split_jitted.lower(state, x).compile()
    function_program = function.lower(params, x).compile()
    difference = kernel_difference(kernels(function_program.as_text()), kernels(module_program.as_text()))
    return calls, difference, flops_of(module_program) / flops_of(function_program)


def flops_of(compiled: Any) -> float:
    cost = compiled.cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


def overhead_calls(width: int, heads: int, tokens: int) -> dict[str, Callable[[], jax.Array]]:
    """``MultiHeadAttention`` on a tiny ``(2, tokens, width)`` input, called every way a Flax
    user can: the function, ``jax.jit`` of ``nnx.merge``, ``nnx.jit`` in graph mode (the
    default), in tree mode (``graph=False``) and through ``nnx.cached_partial``."""
    constructor_args, kwargs = constructors(width, heads, tokens)["MultiHeadAttention"]
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, tokens, width)), jnp.float32)
    module = jax_attn.MultiHeadAttention(*constructor_args, rngs=nnx.Rngs(0))
    module.eval()
    params = {name: jnp.asarray(value) for name, value in module.to_params().items()}
    function = jax.jit(functools.partial(jax_attn.multi_head_attention, **kwargs))
    graphdef, state = nnx.split(module)
    split_jitted = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
    nnx_jitted = nnx.jit(lambda m, x: m(x))
    tree_jitted = nnx.jit(lambda m, x: m(x), graph=False)
    cached = nnx.cached_partial(nnx_jitted, module)
    return {
        FUNCTION_CALL: lambda: function(params, x),
        SPLIT: lambda: split_jitted(state, x),
        NNX_JIT: lambda: nnx_jitted(module, x),
        "module (nnx.jit, graph=False)": lambda: tree_jitted(module, x),
        "module (nnx.cached_partial of nnx.jit)": lambda: cached(x),
    }


FUNCTION = {
    "SelfAttentionV1": "self_attention_v1",
    "SelfAttentionV2": "self_attention_v2",
    "CausalAttention": "causal_attention",
    "MultiHeadAttentionWrapper": "multi_head_attention_wrapper",
    "MultiHeadAttention": "multi_head_attention",
    "FusedSingleHeadAttention": "fused_single_head_attention",
    "FusedMultiHeadAttention": "fused_multi_head_attention",
    "FusedCausalAttention": "fused_causal_attention",
}


def time_calls(
    calls: dict[str, Callable[[], jax.Array]], rounds: int, per_round: int
) -> dict[str, list[float]]:
    """Seconds per call of each, per round; every call runs once first (compilation). Each
    round starts with the next call, so that none always runs first."""
    for call in calls.values():
        call().block_until_ready()
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for round_index in range(rounds):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            call = calls[name]
            start = time.perf_counter()
            for _ in range(per_round):
                out = call()
            out.block_until_ready()
            times[name].append((time.perf_counter() - start) / per_round)
    return times


def quartiles(values: list[float]) -> str:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return f"{median:.3f} ({q1:.3f}-{q3:.3f})"


def benchmark(args: argparse.Namespace) -> str:
    rng = np.random.default_rng(0)
    rows = []
    for layer, (constructor_args, kwargs) in constructors(args.width, args.heads, args.tokens).items():
        two_dimensional = layer in ("SelfAttentionV1", "SelfAttentionV2")
        shape = (args.tokens, args.width) if two_dimensional else (args.batch, args.tokens, args.width)
        x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
        calls, difference, flops_ratio = calls_of(layer, constructor_args, kwargs, x, args.implementation)
        times = time_calls(calls, args.rounds, args.calls)
        function = times[FUNCTION_CALL]
        milliseconds = f"{statistics.median(function) * 1e3:.2f}"
        cells = [layer, str(shape), difference, f"{flops_ratio:.3f}", milliseconds]
        for name in (SPLIT, NNX_JIT):
            ratios = [m / f for m, f in zip(times[name], function, strict=True)]
            cells += [f"{statistics.median(times[name]) * 1e3:.2f}", quartiles(ratios)]
        rows.append("| " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)  # progress; the whole table is printed at the end
    overhead = time_calls(overhead_calls(16, 2, 8), args.rounds, 200)
    device = jax.devices()[0]
    header = [
        f"Flax modules vs the jax_attn functions: D={args.width}, N={args.heads}, T={args.tokens}, "
        f"B={args.batch}, float32, implementation={args.implementation!r}; {args.rounds} rounds of "
        f"{args.calls} calls, medians (ratios: median of the per-round ratios, quartiles in brackets). "
        f"Device: {device.platform} ({device.device_kind}); jax {jax.__version__}, "
        f"flax {importlib.metadata.version('flax')}; {platform.machine()}; load average "
        f"{' '.join(open('/proc/loadavg').read().split()[:3])} at the end.",
        "",
        "| layer | input | kernels module vs function | FLOPs module / function | function ms "
        "| split+jax.jit ms | split / function | nnx.jit ms | nnx.jit / function |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    footer = [
        "",
        f"Per-call overhead: MultiHeadAttention(16, 16, 8, 0.0, 2) on a (2, 8, 16) input, "
        f"{args.rounds} rounds of 200 calls, median microseconds per call.",
        "",
        "| call | us per call |",
        "| --- | ---: |",
        *(f"| {name} | {statistics.median(samples) * 1e6:.1f} |" for name, samples in overhead.items()),
    ]
    return "\n".join([*header, *rows, *footer]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--implementation", default="reference")
    parser.add_argument("--out", help="append the table to this Markdown file")
    args = parser.parse_args()
    table = benchmark(args)
    print(table)
    if args.out:
        with open(args.out, "a") as out:
            out.write("\n" + table)


if __name__ == "__main__":
    main()
