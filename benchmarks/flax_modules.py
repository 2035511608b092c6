"""Each Flax NNX module's jitted call against the jax_attn function it wraps, in one process.

    PYTHONPATH=. python benchmarks/flax_modules.py --out benchmarks/flax_modules.md

Every layer is built fresh (``jax_attn.<Class>(..., rngs=nnx.Rngs(0))``, eval mode) and its
weights handed to the function (``module.to_params()``), so both compute the same layer. Three
calls are timed round-robin in every round: the function under ``jax.jit`` (the layer's
constructor arguments static), the module under ``nnx.jit``, and the module under ``jax.jit``
of ``nnx.merge`` (Flax's split/merge pattern, without ``nnx.jit``'s per-call graph walk). A
round times ``--calls`` calls of each (the order rotating from round to round); the table gives
the median time per call and the median of the per-round ratios module / function (below 1:
the module is faster), and the ratio of the FLOPs that XLA's cost analysis counts in the two
compiled programs. The two-dimensional classes (V1, V2) take one ``(T, D)`` sequence, the
others ``(B, T, D)``.
"""

from __future__ import annotations

import argparse
import functools
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


def calls_of(
    layer: str, args: tuple[Any, ...], kwargs: dict[str, Any], x: jax.Array, implementation: str
) -> tuple[dict[str, Callable[[], jax.Array]], float]:
    """The three calls, and the ratio of XLA's estimated FLOPs, module / function, of the two
    compiled programs (1.0: the module compiles to the same arithmetic)."""
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
        "function (jax.jit)": lambda: function(params, x),
        "module (nnx.jit)": lambda: nnx_jitted(module, x),
        "module (jax.jit of nnx.merge)": lambda: split_jitted(state, x),
    }
    flops = [
        flops_of(jitted.lower(*arguments))
        for jitted, arguments in ((split_jitted, (state, x)), (function, (params, x)))
    ]
    return calls, flops[0] / flops[1]


def flops_of(lowered: Any) -> float:
    cost = lowered.compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


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


def benchmark(args: argparse.Namespace) -> str:
    rng = np.random.default_rng(0)
    rows = []
    for layer, (constructor_args, kwargs) in constructors(args.width, args.heads, args.tokens).items():
        two_dimensional = layer in ("SelfAttentionV1", "SelfAttentionV2")
        shape = (args.tokens, args.width) if two_dimensional else (args.batch, args.tokens, args.width)
        x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
        calls, flops_ratio = calls_of(layer, constructor_args, kwargs, x, args.implementation)
        times = time_calls(calls, args.rounds, args.calls)
        function = times["function (jax.jit)"]
        cells = [layer, str(shape), f"{flops_ratio:.3f}", f"{statistics.median(function) * 1e3:.2f}"]
        for name in ("module (nnx.jit)", "module (jax.jit of nnx.merge)"):
            ratios = [m / f for m, f in zip(times[name], function, strict=True)]
            cells += [f"{statistics.median(times[name]) * 1e3:.2f}", f"{statistics.median(ratios):.3f}"]
        rows.append("| " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    device = jax.devices()[0]
    header = [
        f"Flax modules vs the jax_attn functions: D={args.width}, N={args.heads}, T={args.tokens}, "
        f"B={args.batch}, float32, implementation={args.implementation!r}; {args.rounds} rounds of "
        f"{args.calls} calls, medians. Device: {device.platform} ({device.device_kind}); "
        f"jax {jax.__version__}; {platform.machine()}.",
        "",
        "| layer | input | FLOPs module / function | function ms | nnx.jit ms | nnx.jit / function "
        "| split+jax.jit ms | split / function |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    return "\n".join([*header, *rows]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--implementation", default="reference")
    parser.add_argument("--out", help="append the table to this Markdown file")
    args = parser.parse_args()
    table = benchmark(args)
    if args.out:
        with open(args.out, "a") as out:
            out.write("\n" + table)


if __name__ == "__main__":
    main()
