"""The least work each framework cannot avoid on the causal layer, timed in that framework.

    python -m parity_tests.bench.floor [--shape S ...] [--rounds N]

For each shape, in one process, round-robin, medians: torch SDPA's layer, each framework's
fastest layer, and each framework's floor; the table gives every time and its ratio to torch
SDPA's. A floor above a target's ratio says the target cannot be met in that framework on this
machine, whatever the layer's code does around its unavoidable work.

- NumPy floor (long sequences): the sum of the medians of the GEMMs of the blockwise layer at
  its block shapes (the fused QKV projection and the output projection as one matmul each; per
  head, for every (query block, key block) pair the causal loop visits, QK^T and weights @ V as
  batched ``np.matmul`` on contiguous operands into preallocated outputs), plus one ``np.exp``
  pass over the T x S/2 causal scores, done block by block in place (NumPy's ufuncs run on one
  core). Each block's operands are the same arrays every time, so caches are warm: a lower bound.
- JAX floor (long sequences): the same GEMMs and the exponential of every visited score block as
  one jitted XLA program laid out as the blockwise layer (loops over heads, query blocks and the
  causal key blocks), with no masking, no running maximum and no sums.
- NumPy floor (B2_T6_d3to4): a transcription of the layer with no checks and no steps, the few
  NumPy operations the layer must make (weights stacked once, outside the call).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from numpy_attn import qkv_weights
from numpy_attn.fast.blockwise import block_sides
from numpy_attn.fast.options import DEFAULT_BLOCK_SIZE
from parity_tests.bench.implementations import SHAPES, Shape, make_call, make_inputs
from parity_tests.bench.output import format_time
from parity_tests.usage import integer, script_parser

__all__ = [
    "SMALL", "SMALL_TARGETS", "TARGETS", "floor_calls", "markdown_floor", "measure_floor",
    "numpy_projections", "numpy_small_floor", "round_robin_medians", "round_robin_times",
]  # fmt: skip

# issue 16's targets: a ratio to torch SDPA's time on long sequences, seconds on the small call
TARGETS = {"numpy": 1.3, "jax": 0.9}
SMALL_TARGETS = {"numpy": 25e-6, "jax": 40e-6}
SMALL = "B2_T6_d3to4"


def _blocks(shape: Shape, framework: str) -> tuple[int, int]:
    """(block size, query/key block pairs the causal loop visits per head) at the default block size,
    in ``framework``'s layer: numpy_attn's blocks hold the batch (``block_sides``), jax_attn's one
    sequence."""
    batch = shape.batch if framework == "numpy" else 1
    block = block_sides(DEFAULT_BLOCK_SIZE, batch, shape.tokens, shape.tokens)[0]
    num_blocks = -(-shape.tokens // block)
    return block, num_blocks * (num_blocks + 1) // 2


def numpy_projections(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> Callable[[], None]:
    """The layer's two projections in NumPy, one matmul each into preallocated outputs: the fused
    QKV product of x and the output product of a (B*T, E) context."""
    b, t, d, e = shape.batch, shape.tokens, shape.d_in, shape.d_out
    qkv_weight = qkv_weights(params)[0].T  # (D, 3E)
    out_weight = params["out_proj.weight"].T  # (E, E)
    flat_x, projected = x.reshape(b * t, d), np.empty((b * t, 3 * e), np.float32)
    context = np.random.default_rng(1).standard_normal((b * t, e), dtype=np.float32)  # the heads', merged
    output = np.empty((b * t, e), np.float32)

    def projections() -> None:
        np.matmul(flat_x, qkv_weight, out=projected)  # (B*T, 3E)
        np.matmul(context, out_weight, out=output)  # (B*T, E)

    return projections


def _numpy_floor(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> dict[str, Callable[[], Any]]:
    b, t, e, n = shape.batch, shape.tokens, shape.d_out, shape.num_heads
    h = e // n
    block, pairs = _blocks(shape, "numpy")
    rng = np.random.default_rng(2)
    query_block, key_block, value_block = (
        rng.standard_normal((b, block, h), dtype=np.float32) for _ in range(3)
    )
    scores = rng.uniform(0, 1, (b, block, block)).astype(np.float32)  # a block's weights
    block_context = np.empty((b, block, h), np.float32)
    exp_blocks = round(n * t * t / 2 / (block * block))  # T x S/2 scores per head, in blocks
    shifted_scores = rng.uniform(-10, 0, (b, block, block)).astype(np.float32)  # scores minus their max

    def qk() -> None:
        for _ in range(n * pairs):
            np.matmul(query_block, key_block.swapaxes(-1, -2), out=scores)  # (B, bq, bk)

    def weights_v() -> None:
        for _ in range(n * pairs):
            np.matmul(scores, value_block, out=block_context)  # (B, bq, H)

    def exp() -> None:
        for _ in range(exp_blocks):
            np.exp(shifted_scores, out=scores)

    return {
        "numpy floor: projections": numpy_projections(shape, params, x),
        "numpy floor: QK^T blocks": qk,
        "numpy floor: weights @ V blocks": weights_v,
        "numpy floor: exp of T x S/2 scores": exp,
    }


def _jax_floor(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp

    b, t, d, e, n = shape.batch, shape.tokens, shape.d_in, shape.d_out, shape.num_heads
    h = e // n
    block, _ = _blocks(shape, "jax")
    num_blocks = t // block  # the long shapes' T is a multiple of the block size

    def layer(x: jax.Array, weight: jax.Array, out_weight: jax.Array) -> jax.Array:
        # (3E, D) -> (N, 3H, D): head n's query, key and value rows, as the blockwise layer
        head_weights = jnp.swapaxes(weight.reshape(3, n, h, d), 0, 1).reshape(n, 3 * h, d)

        def one_head(head: jax.Array, context: jax.Array) -> jax.Array:
            projected = jnp.einsum("td,ed->te", x[head // n], head_weights[head % n])  # (T, 3H)
            queries, keys, values = jnp.split(projected, 3, axis=-1)  # 3 x (T, H)

            def one_query_block(qi: jax.Array, head_context: jax.Array) -> jax.Array:
                query_block = jax.lax.dynamic_slice_in_dim(queries, qi * block, block)  # (bq, H)

                def step(ki: jax.Array, acc: jax.Array) -> jax.Array:
                    key_block = jax.lax.dynamic_slice_in_dim(keys, ki * block, block)  # (bk, H)
                    value_block = jax.lax.dynamic_slice_in_dim(values, ki * block, block)  # (bk, H)
                    weights = jnp.exp(jnp.einsum("th,sh->ts", query_block, key_block))  # (bq, bk)
                    return acc + weights @ value_block  # (bq, H)

                def visit(ki: jax.Array, acc: jax.Array) -> jax.Array:  # causal: later key blocks skipped
                    return jax.lax.cond(ki <= qi, step, lambda _, unchanged: unchanged, ki, acc)

                acc = jax.lax.fori_loop(0, num_blocks, visit, jnp.zeros((block, h), x.dtype))  # (bq, H)
                return jax.lax.dynamic_update_slice_in_dim(head_context, acc, qi * block, axis=0)

            head_context = jax.lax.fori_loop(0, num_blocks, one_query_block, jnp.zeros((t, h), x.dtype))
            return jax.lax.dynamic_update_slice(
                context, head_context[None, :, None], (head // n, 0, head % n, 0)
            )

        context = jax.lax.fori_loop(0, b * n, one_head, jnp.zeros((b, t, n, h), x.dtype))  # (B, T, N, H)
        return jnp.einsum("bte,oe->bto", context.reshape(b, t, e), out_weight)  # (B, T, E)

    weight = jnp.asarray(qkv_weights(params)[0])  # (3E, D)
    out_weight, jax_x = jnp.asarray(params["out_proj.weight"]), jnp.asarray(x)
    jitted = jax.jit(layer)
    return lambda: jitted(jax_x, weight, out_weight).block_until_ready()


def numpy_small_floor(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray) -> Callable[[], Any]:
    """The small call's layer as the few NumPy operations it must make: no checks, no steps, the
    QKV weights stacked and the causal mask built once, outside the call."""
    n, h = shape.num_heads, shape.d_out // shape.num_heads
    qkv_weight = qkv_weights(params)[0].T  # (D, 3E)
    out_weight, out_bias = params["out_proj.weight"].T, params["out_proj.bias"]
    hidden = np.triu(np.ones((shape.tokens, shape.tokens), bool), 1)  # built once, as the layer's cached mask

    def layer() -> np.ndarray:
        b, t, _ = x.shape
        qkv = (x @ qkv_weight).reshape(b, t, 3, n, h)  # (B, T, 3, N, H)
        queries, keys, values = (
            qkv[:, :, 0].swapaxes(1, 2),
            qkv[:, :, 1].swapaxes(1, 2),
            qkv[:, :, 2].swapaxes(1, 2),
        )
        attn_scores = queries @ keys.swapaxes(-1, -2)  # (B, N, T, S)
        np.copyto(attn_scores, -np.inf, where=hidden)  # causal
        attn_scores *= 1 / h**0.5
        attn_scores -= attn_scores.max(axis=-1, keepdims=True)
        np.exp(attn_scores, out=attn_scores)
        attn_scores *= 1 / attn_scores.sum(axis=-1, keepdims=True)
        context_vec = (attn_scores @ values).swapaxes(1, 2).reshape(b, t, n * h)  # (B, T, E)
        return context_vec @ out_weight + out_bias

    return layer


def floor_calls(shape_name: str) -> dict[str, Callable[[], Any]]:
    """What the floor run times at one shape: torch SDPA's layer, the fastest layers, the floors."""
    shape = SHAPES[shape_name]
    params, x = make_inputs(shape)
    if shape_name == SMALL:
        return {"torch SDPA layer": make_call("torch_sdpa", shape, params, x),
                "numpy layer (auto)": make_call("numpy_auto", shape, params, x),
                "numpy floor: the layer's operations, no checks": numpy_small_floor(shape, params, x),
                "jax layer (auto, jitted)": make_call("jax_auto", shape, params, x)}  # fmt: skip
    return {"torch SDPA layer": make_call("torch_sdpa", shape, params, x),
            "numpy layer (blockwise)": make_call("numpy_blockwise", shape, params, x),
            "numpy layer (blockwise, heads on threads)":
                make_call("numpy_blockwise_threads", shape, params, x),
            **_numpy_floor(shape, params, x),
            "jax layer (blockwise, jitted)": make_call("jax_blockwise", shape, params, x),
            "jax floor: GEMMs and exp, one XLA program": _jax_floor(shape, params, x)}  # fmt: skip


def round_robin_times(
    calls: dict[Any, Callable[[], Any]], rounds: int, repeats: int = 1
) -> dict[Any, list[float]]:
    """Each call's time in seconds in each of ``rounds`` rounds, after one warm-up call each
    (compiles, caches): every round times each call ``repeats`` times in a row, in an order that
    starts one call later every round, so no call always follows the same other."""
    for call in calls.values():
        call()
    samples: dict[Any, list[float]] = {key: [] for key in calls}
    keys = list(calls)
    for round_index in range(rounds):
        for key in keys[round_index % len(keys) :] + keys[: round_index % len(keys)]:
            start = time.perf_counter()
            for _ in range(repeats):
                calls[key]()
            samples[key].append((time.perf_counter() - start) / repeats)
    return samples


def round_robin_medians(
    calls: dict[Any, Callable[[], Any]], rounds: int, repeats: int = 1
) -> dict[Any, float]:
    """Each call's median time in seconds over the rounds of ``round_robin_times``."""
    return {key: statistics.median(times) for key, times in round_robin_times(calls, rounds, repeats).items()}


def measure_floor(shape_name: str, rounds: int = 5) -> list[dict[str, Any]]:
    """Rows ``{"shape", "what", "median_s", "ratio"}`` (ratio to torch SDPA's median), then one row
    per framework's floor summed over its parts; small calls are timed in repeats of 200."""
    calls = floor_calls(shape_name)
    medians = round_robin_medians(calls, rounds, repeats=200 if shape_name == SMALL else 1)
    numpy_parts = [name for name in medians if name.startswith("numpy floor: ")]
    if len(numpy_parts) > 1:
        medians["numpy floor (sum of the parts)"] = sum(medians[name] for name in numpy_parts)
    sdpa = medians["torch SDPA layer"]
    return [{"shape": shape_name, "what": name, "median_s": seconds, "ratio": seconds / sdpa}
            for name, seconds in medians.items()]  # fmt: skip


def target(row: dict[str, Any]) -> str:
    """The issue's target for the framework a row times ('' for torch)."""
    framework = row["what"].split()[0]
    if row["shape"] == SMALL:
        return f"<= {SMALL_TARGETS[framework] * 1e6:.0f} us" if framework in SMALL_TARGETS else ""
    return f"<= {TARGETS[framework]}x" if framework in TARGETS else ""


def markdown_floor(rows: list[dict[str, Any]]) -> str:
    lines = ["| shape | what | time | vs torch SDPA | target |", "| --- | --- | ---: | ---: | --- |"]
    for row in rows:
        time_ = format_time(row["median_s"])
        lines.append(f"| {row['shape']} | {row['what']} | {time_} | {row['ratio']:.2f}x | {target(row)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = script_parser("parity_tests.bench.floor", __doc__)
    parser.add_argument("--shape", nargs="+", default=["B8_T1024", "B1_T4096", SMALL], choices=list(SHAPES))
    parser.add_argument(
        "--rounds", type=integer("--rounds", 1, 1000), default=5, help="round-robin rounds (medians)"
    )
    args = parser.parse_args(argv)
    print(markdown_floor([]))
    for shape in args.shape:  # rows printed as each shape is measured
        for row in measure_floor(shape, args.rounds):
            print(markdown_floor([row]).splitlines()[-1], flush=True)
    print(f"load average at the end: {' '.join(open('/proc/loadavg').read().split()[:3])}")


if __name__ == "__main__":
    main()
