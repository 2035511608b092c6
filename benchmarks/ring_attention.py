"""Ring attention, weak scaling: T per device fixed while the ring grows (host CPU devices).

Run ``python benchmarks/ring_attention.py [--tokens-per-device 512] [--rounds 5]``; it prints a
Markdown table and writes ``benchmarks/ring_attention.json``.

For each ring size P the forward pass of causal ``ring_attention`` is timed at T = P x the
tokens per device (best of ``--rounds``, after compiling; every configuration runs once per
round, so that a busy spell of the shared CPU hits all alike), next to:
- compute: the time one device takes for the blocks that a ring of P computes in all
  (``ring_attention`` on a ring of one at the per-device length: one (T/P, T/P) block, times
  the number of visible block pairs), spread over the cores the host devices share;
- communication and overhead: what remains of the measured time. Host devices pass blocks by
  memory copies, so this is mostly synchronisation between the device threads.
The CPU is shared (2 cores, other jobs running): the timings are noisy; compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

DEVICES = 8
HERE = pathlib.Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens-per-device", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_attn.parallel import ring_attention

    def best_times(runs: dict) -> dict:
        """Best time of each ``name -> (fn, inputs)``, the runs interleaved round by round."""
        for fn, inputs in runs.values():
            jax.block_until_ready(fn(*inputs))  # compile
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, (fn, inputs) in runs.items():
                start = time.perf_counter()
                jax.block_until_ready(fn(*inputs))
                times[name].append(time.perf_counter() - start)
        return {name: min(values) for name, values in times.items()}

    def inputs_on(mesh, num_tokens):
        shape = (args.batch, args.heads, num_tokens, args.head_dim)  # (B, N, T, H)
        sharding = NamedSharding(mesh, P(None, None, "seq"))
        rng = np.random.default_rng(0)
        return [jax.device_put(jnp.asarray(rng.normal(size=shape), jnp.float32), sharding) for _ in range(3)]

    def ring_on(mesh, load_balance):
        return jax.jit(lambda q, k, v: ring_attention(q, k, v, mesh, load_balance=load_balance))

    block_tokens = args.tokens_per_device
    one = jax.make_mesh((1,), ("seq",), axis_types=(AxisType.Auto,), devices=jax.devices()[:1])
    # one full (T/P, T/P) block: a ring of one without the causal mask
    runs = {
        "block": (
            jax.jit(lambda q, k, v: ring_attention(q, k, v, one, causal=False)),
            inputs_on(one, block_tokens),
        )
    }
    for size in (1, 2, 4, 8):
        mesh = jax.make_mesh((size,), ("seq",), axis_types=(AxisType.Auto,), devices=jax.devices()[:size])
        inputs = inputs_on(mesh, size * block_tokens)
        for load_balance in (False, True):
            runs[size, load_balance] = (ring_on(mesh, load_balance), inputs)
    seconds = best_times(runs)
    block_seconds = seconds.pop("block")
    flops_per_block = 4 * args.batch * args.heads * block_tokens**2 * args.head_dim
    cores = os.cpu_count()
    rows = []
    for (size, load_balance), ring_seconds in seconds.items():
        # causal: the P(P+1)/2 block pairs on or below the diagonal, of P^2, over the shared cores
        compute = size * (size + 1) / 2 * block_seconds / min(size, cores)
        rows.append(
            {
                "devices": size,
                "tokens": size * block_tokens,
                "load_balance": load_balance,
                "ms": 1e3 * ring_seconds,
                "compute_ms": 1e3 * compute,
                "other_ms": 1e3 * (ring_seconds - compute),
            }
        )
    result = {
        "shape": {"B": args.batch, "N": args.heads, "T_per_device": block_tokens, "H": args.head_dim},
        "block_ms": 1e3 * block_seconds,
        "block_gflops": flops_per_block / block_seconds / 1e9,
        "cores": cores,
        "rows": rows,
    }
    (HERE / "ring_attention.json").write_text(json.dumps(result, indent=1))
    speed = f"{result['block_ms']:.2f} ms, {result['block_gflops']:.1f} GFLOP/s"
    print(f"one (T/P, T/P) block: {speed}, {cores} cores")
    print("| devices | T | zigzag | ms | compute ms | communication + overhead ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['devices']} | {row['tokens']} | {row['load_balance']} | {row['ms']:.1f} | "
            f"{row['compute_ms']:.1f} | {row['other_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
