"""The small call (B2/T6, d 3->4) timed in a process that imports one framework alone.

    python -m parity_tests.bench.small --framework jax [--sync-dispatch] [--rounds 15] [--calls 200]

The bench table and the floor time the small call in a process that also runs torch, whose
OpenMP threads stay awake after each of torch's calls and take the second core: there, NumPy's
and JAX's small calls take up to twice their time in a process of their own. This times the
call as a user of one framework runs it: the layer (``implementation="auto"``, jitted in JAX)
and baselines, round-robin in one process (``floor.round_robin_times``), each round timing
``calls`` calls of each. The baselines are NumPy's floor (the layer's operations, no checks)
and the checks the layer makes on every call or, in JAX, a jitted identity on the same weights
and input (the dispatch alone). The last line
names the frameworks the process imported.

``--sync-dispatch`` sets JAX's ``jax_cpu_enable_async_dispatch`` to False before its first
computation: XLA:CPU then runs a program on the calling thread instead of handing it to one of
its own and waking the caller when it is done, which is most of a small call's time here.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

from parity_tests.bench.floor import SMALL, SMALL_TARGETS, numpy_small_floor, round_robin_times
from parity_tests.bench.implementations import SHAPES, Shape, make_call, make_inputs
from parity_tests.bench.output import format_time
from parity_tests.usage import integer, script_parser

__all__ = ["FRAMEWORKS", "markdown_small", "measure_small", "small_calls"]

FRAMEWORKS = ("numpy", "jax")
ASYNC_DISPATCH = "jax_cpu_enable_async_dispatch"  # JAX's setting that --sync-dispatch turns off


def _jax_dispatch(params: dict[str, Any], x: Any) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp

    jax_params, jax_x = {k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x)
    identity = jax.jit(lambda params, x: x)
    return lambda: identity(jax_params, jax_x).block_until_ready()


def _numpy_checks(shape: Shape, params: dict[str, Any], x: Any) -> Callable[[], Any]:
    """The checks the layer makes on every call: ``check_layer`` as ``multi_head_attention``
    calls it (a remembered verdict on the shapes and arguments, then the finite weights)."""
    from numpy_attn.door import check_layer

    arguments = {"num_heads": shape.num_heads, "context_length": shape.tokens, "dropouts": {"dropout": 0.0}}
    return lambda: check_layer("MultiHeadAttention", params, x, **arguments, implementation="auto")


def small_calls(framework: str) -> dict[str, Callable[[], Any]]:
    """The layer and the baseline that ``measure_small`` times in ``framework``."""
    shape = SHAPES[SMALL]
    params, x = make_inputs(shape)
    layer = make_call(f"{framework}_auto", shape, params, x)
    if framework == "numpy":
        return {"numpy layer (auto)": layer, "numpy floor: the layer's operations, no checks":
                numpy_small_floor(shape, params, x), "numpy checks: the layer's check_layer call":
                _numpy_checks(shape, params, x)}  # fmt: skip
    return {"jax layer (auto, jitted)": layer, "jax dispatch: a jitted identity, same arguments":
            _jax_dispatch(params, x)}  # fmt: skip


def measure_small(framework: str, rounds: int = 15, calls: int = 200) -> list[dict[str, Any]]:
    """Rows ``{"what", "median_s", "best_s"}``: each call's median and fastest round."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    times = round_robin_times(small_calls(framework), rounds, repeats=calls)
    return [{"what": what, "median_s": statistics.median(seconds), "best_s": min(seconds)}
            for what, seconds in times.items()]  # fmt: skip


def markdown_small(rows: list[dict[str, Any]]) -> str:
    lines = ["| what | median | best round | target |", "| --- | ---: | ---: | --- |"]
    for row in rows:
        framework, layer = row["what"].split()[0], " layer " in row["what"]
        target = f"<= {SMALL_TARGETS[framework] * 1e6:.0f} us" if layer else ""
        lines.append(
            f"| {row['what']} | {format_time(row['median_s'])} | {format_time(row['best_s'])} | {target} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = script_parser("parity_tests.bench.small", __doc__)
    parser.add_argument("--framework", choices=FRAMEWORKS, required=True)
    parser.add_argument(
        "--rounds", type=integer("--rounds", 1, 1000), default=15, help="round-robin rounds (medians)"
    )
    parser.add_argument(
        "--calls", type=integer("--calls", 1, 1_000_000), default=200, help="calls of each per round"
    )
    parser.add_argument(
        "--sync-dispatch", action="store_true", help="JAX: run programs on the calling thread"
    )
    args = parser.parse_args(argv)
    if args.sync_dispatch and args.framework != "jax":
        parser.error("--sync-dispatch is a JAX setting")
    if args.framework == "jax":
        import jax

        if args.sync_dispatch:
            jax.config.update(ASYNC_DISPATCH, False)  # read when JAX starts its CPU client
    print(markdown_small(measure_small(args.framework, args.rounds, args.calls)))
    if args.framework == "jax":
        print(f"{ASYNC_DISPATCH}: {jax.config.values[ASYNC_DISPATCH]}")
    imported = [name for name in ("numpy", "torch", "jax") if name in sys.modules]
    print(f"frameworks imported: {', '.join(imported)}")


if __name__ == "__main__":
    main()
