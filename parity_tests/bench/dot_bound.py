"""A bound on the blockwise layer in NumPy and JAX whatever its block size: the attention core's
two products at the best throughput each framework reaches on them, over block sizes.

    python -m parity_tests.bench.dot_bound [--shape S ...] [--query-blocks B ...] [--key-blocks B ...]

Causal attention computes, per sequence and head, the score of every query with every key at or
before it (QK^T, contracting the head dimension H) and the weighted sum of those keys' values
(weights @ V, H columns out): B N H T (T + 1) multiply-adds each, however the work is cut into
blocks. For each pair of block sizes (bq queries, bk keys), both products are timed on
(N, bq, H) and (N, bk, H) operands in one call (the framework's own batched product over one
sequence's heads: batching every sequence too would time memory traffic that a blockwise layer,
one block in cache at a time, does not make), and the best throughput over the pairs is kept.
The bound is the two projections' time (the fused QKV product and the output product, one GEMM
each, measured; in JAX the faster of torch's and Flax's weight layouts) plus the exact causal
FLOPs at those best throughputs: no blockwise layout of the products with blocks in those
ranges beats it, and the softmax passes come on top. It is given as a ratio of torch SDPA's
layer time, measured in the same process, round-robin, medians.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from numpy_attn import qkv_weights
from parity_tests.bench.floor import TARGETS, numpy_projections, round_robin_medians
from parity_tests.bench.implementations import SHAPES, Shape, make_call, make_inputs
from parity_tests.bench.output import format_time
from parity_tests.usage import integer, script_parser

__all__ = ["causal_product_flops", "dot_bound_calls", "markdown_dot_bound", "measure_dot_bound"]

FRAMEWORKS = ("numpy", "jax")
QUERY_BLOCKS = (64, 128, 256, 512, 1024)
KEY_BLOCKS = (256, 512, 1024, 2048)
Blocks = tuple[int, int]  # (bq, bk); (0, 0) for the projections


def causal_product_flops(shape: Shape) -> float:
    """FLOPs of one of the core's two products over the causal triangle, diagonal included."""
    h = shape.d_out // shape.num_heads
    return 2.0 * shape.batch * shape.num_heads * h * shape.tokens * (shape.tokens + 1) / 2


def _operands(shape: Shape, blocks: Blocks) -> tuple[np.ndarray, ...]:
    """Queries ``(N, bq, H)``, keys and values ``(N, bk, H)`` and weights ``(N, bq, bk)``."""
    (bq, bk), rng = blocks, np.random.default_rng(blocks)
    heads, head_dim = shape.num_heads, shape.d_out // shape.num_heads
    queries = rng.standard_normal((heads, bq, head_dim), dtype=np.float32)
    keys, values = (rng.standard_normal((heads, bk, head_dim), dtype=np.float32) for _ in range(2))
    return queries, keys, values, rng.uniform(0, 1, (heads, bq, bk)).astype(np.float32)


def _numpy_calls(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray, blocks: list[Blocks]) -> dict:
    calls: dict[tuple[str, Blocks], Callable[[], Any]] = {
        ("projections", (0, 0)): numpy_projections(shape, params, x)
    }
    for block in blocks:
        queries, keys, values, weights = _operands(shape, block)
        scores, block_context = np.empty_like(weights), np.empty_like(queries)
        calls["QK^T", block] = lambda q=queries, k=keys, s=scores: np.matmul(q, k.swapaxes(-1, -2), out=s)
        calls["weights @ V", block] = lambda w=weights, v=values, c=block_context: np.matmul(w, v, out=c)
    return calls


def _jax_calls(shape: Shape, params: dict[str, np.ndarray], x: np.ndarray, blocks: list[Blocks]) -> dict:
    import jax
    import jax.numpy as jnp

    b, e = shape.batch, shape.d_out
    rng = np.random.default_rng(1)
    weight = jnp.asarray(qkv_weights(params)[0])  # (3E, D)
    out_weight, jax_x = jnp.asarray(params["out_proj.weight"]), jnp.asarray(x)
    context = jnp.asarray(rng.standard_normal((b, shape.tokens, e), dtype=np.float32))

    @jax.jit
    def projections(x: jax.Array, context: jax.Array, weight: jax.Array, out_weight: jax.Array):
        return jnp.einsum("btd,ed->bte", x, weight), jnp.einsum("bte,oe->bto", context, out_weight)

    @jax.jit
    def projections_in_out(x: jax.Array, context: jax.Array, weight: jax.Array, out_weight: jax.Array):
        return x @ weight, context @ out_weight  # (in, out) weights, as Flax keeps them

    weights_in_out = weight.T.copy(), out_weight.T.copy()

    qk = jax.jit(lambda queries, keys: jnp.einsum("nth,nsh->nts", queries, keys))  # (N, bq, bk)
    weights_v = jax.jit(lambda weights, values: weights @ values)  # (N, bq, H)
    calls: dict[tuple[str, Blocks], Callable[[], Any]] = {
        ("projections", (0, 0)): lambda: jax.block_until_ready(
            projections(jax_x, context, weight, out_weight)
        ),
        ("projections, (in, out) weights", (0, 0)): lambda: jax.block_until_ready(
            projections_in_out(jax_x, context, *weights_in_out)
        ),
    }
    for block in blocks:
        queries, keys, values, weights = (jnp.asarray(a) for a in _operands(shape, block))
        calls["QK^T", block] = lambda q=queries, k=keys: qk(q, k).block_until_ready()
        calls["weights @ V", block] = lambda w=weights, v=values: weights_v(w, v).block_until_ready()
    return calls


def dot_bound_calls(shape: Shape, blocks: list[Blocks]) -> dict[tuple[str, str, Blocks], Callable[[], Any]]:
    """``(framework, what, (bq, bk)) -> call``: torch SDPA's layer, and per framework the
    projections (blocks ``(0, 0)``) and both products at every pair of block sizes."""
    params, x = make_inputs(shape)
    calls: dict[tuple[str, str, Blocks], Callable[[], Any]] = {
        ("torch", "SDPA layer", (0, 0)): make_call("torch_sdpa", shape, params, x)
    }
    for framework, make in (("numpy", _numpy_calls), ("jax", _jax_calls)):
        for (what, block), call in make(shape, params, x, blocks).items():
            calls[framework, what, block] = call
    return calls


def _product_flops(shape: Shape, blocks: Blocks) -> float:
    return 2.0 * shape.num_heads * (shape.d_out // shape.num_heads) * blocks[0] * blocks[1]


def measure_dot_bound(
    shape_name: str, query_blocks: list[int], key_blocks: list[int], rounds: int = 5
) -> list[dict[str, Any]]:
    """Rows ``{"shape", "framework", "what", "blocks", "median_s", "gflops"}`` for every timed
    call, then per framework a row ``what="bound"`` with ``ratio``: projections plus both causal
    products at the best throughput over the pairs of block sizes up to T, over torch SDPA's
    layer time."""
    shape = SHAPES[shape_name]
    blocks = [(bq, bk) for bq in query_blocks for bk in key_blocks if max(bq, bk) <= shape.tokens]
    medians = round_robin_medians(dot_bound_calls(shape, blocks), rounds)
    rows = [
        {"shape": shape_name, "framework": framework, "what": what, "blocks": block, "median_s": seconds,
         "gflops": _product_flops(shape, block) / seconds / 1e9 if any(block) else None}
        for (framework, what, block), seconds in medians.items()
    ]  # fmt: skip
    sdpa = medians["torch", "SDPA layer", (0, 0)]
    for framework in FRAMEWORKS:
        products = [row for row in rows if row["framework"] == framework and any(row["blocks"])]
        core = sum(
            causal_product_flops(shape) / max(row["gflops"] for row in products if row["what"] == what) / 1e9
            for what in ("QK^T", "weights @ V")
        )
        bound = min(
            row["median_s"] for row in rows if row["framework"] == framework and not any(row["blocks"])
        )
        bound += core
        rows.append({"shape": shape_name, "framework": framework, "what": "bound", "blocks": (0, 0),
                     "median_s": bound, "gflops": None, "ratio": bound / sdpa})  # fmt: skip
    return rows


def markdown_dot_bound(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| shape | framework | what | bq x bk | time | GFLOP/s | vs torch SDPA | target |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        gflops = "" if row["gflops"] is None else f"{row['gflops']:.1f}"
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else ""
        target = f"<= {TARGETS[row['framework']]}x" if "ratio" in row else ""
        block = "{} x {}".format(*row["blocks"]) if any(row["blocks"]) else ""
        time_ = format_time(row["median_s"])
        lines.append(
            f"| {row['shape']} | {row['framework']} | {row['what']} | {block} | {time_} "
            f"| {gflops} | {ratio} | {target} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = script_parser("parity_tests.bench.dot_bound", __doc__)
    parser.add_argument("--shape", nargs="+", default=["B8_T1024", "B1_T4096"],
                        choices=[name for name in SHAPES if SHAPES[name].tokens >= 128])  # fmt: skip
    parser.add_argument(
        "--query-blocks",
        nargs="+",
        type=integer("--query-blocks", 1, 65536),
        default=list(QUERY_BLOCKS),
        help="query block sizes tried",
    )
    parser.add_argument(
        "--key-blocks",
        nargs="+",
        type=integer("--key-blocks", 1, 65536),
        default=list(KEY_BLOCKS),
        help="key block sizes tried",
    )
    parser.add_argument(
        "--rounds", type=integer("--rounds", 1, 1000), default=5, help="round-robin rounds (medians)"
    )
    args = parser.parse_args(argv)
    print(markdown_dot_bound([]))
    for shape in args.shape:
        for row in measure_dot_bound(shape, args.query_blocks, args.key_blocks, args.rounds):
            print(markdown_dot_bound([row]).splitlines()[-1], flush=True)
    print(f"load average at the end: {' '.join(open('/proc/loadavg').read().split()[:3])}")


if __name__ == "__main__":
    main()
