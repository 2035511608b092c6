"""A data-parallel GPT train step over several processes with ``jax.distributed``, on localhost.

Run ``python examples/distributed_train.py --out DIR``: it starts ``--num-processes`` (2, a divisor
of the batch of 8 rows, so that every process feeds as many) copies of itself, each one JAX
process with one CPU device, joined by ``jax.distributed.initialize`` (CPU collectives over
gloo). They build the same GPT from the same seed, split one global batch over a ("data",) mesh
that spans the processes (each process feeds only its own rows) and take one SGD step:
``jax.jit`` all-reduces the gradients across processes. The launcher then takes the same step in
one process on the whole batch. DIR receives ``distributed.npz`` (written by process 0) and
``single.npz``: the loss and every parameter after the step. The launcher compares them with the
project's tolerance table and exits 1, naming the first that differs, if any does.

On a real cluster, run the worker part on every host with the coordinator's address instead.
"""

from __future__ import annotations

import argparse
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import optax
from flax import nnx

from jax_attn import GPTModel
from jax_attn.parallel import shard_model
from parity_tests.compare import compare_steps
from parity_tests.usage import OneLineParser, integer

CONFIG = {
    "vocab_size": 96, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
    "drop_rate": 0.0, "qkv_bias": False,
}  # fmt: skip
BATCH = 8
LEARNING_RATE = 0.1


def loss_fn(model: GPTModel, token_ids: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy of ``model`` on ``(B, T)`` ids and targets."""
    logits = model(token_ids)  # (B, T, V)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@nnx.jit
def train_step(
    model: GPTModel, optimizer: nnx.Optimizer, token_ids: jax.Array, targets: jax.Array
) -> jax.Array:
    """One optimizer step on the batch, in place; returns the loss before the step."""
    loss, grads = nnx.value_and_grad(loss_fn)(model, token_ids, targets)
    optimizer.update(model, grads)
    return loss


def make_batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The global batch: ``(B, T)`` token ids and next-token targets, the same in every process."""
    tokens = np.random.default_rng(seed).integers(
        0, CONFIG["vocab_size"], (BATCH, CONFIG["context_length"] + 1)
    )
    return tokens[:, :-1], tokens[:, 1:]


def make_model() -> GPTModel:
    """The same GPT in every process (seed 0), dropout off."""
    model = GPTModel(CONFIG, rngs=nnx.Rngs(0))
    model.eval()
    return model


def make_optimizer(model: GPTModel) -> nnx.Optimizer:
    """SGD: the step is linear in the gradients, so equal gradients give equal weights."""
    return nnx.Optimizer(model, optax.sgd(LEARNING_RATE), wrt=nnx.Param)


def save_step(path: pathlib.Path, loss: jax.Array, model: GPTModel) -> None:
    """The loss and the model's weights (the project's format) after the step, as .npz."""
    np.savez(path, loss=np.asarray(loss), **model.to_params())


def run_worker(process_id: int, num_processes: int, port: int, out: pathlib.Path) -> None:
    """One process of the data-parallel run."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=num_processes, process_id=process_id)
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    model = shard_model(make_model(), mesh, model_axis=None)  # replicated weights: data parallelism
    optimizer = make_optimizer(model)
    batch_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    rows = BATCH // num_processes
    token_ids, targets = (
        jax.make_array_from_process_local_data(batch_sharding, x[process_id * rows : (process_id + 1) * rows])
        for x in make_batch()
    )  # each process feeds its own rows of the (B, T) batch
    loss = train_step(model, optimizer, token_ids, targets)
    if process_id == 0:  # weights and loss are replicated: every process holds all of them
        save_step(out / "distributed.npz", loss, model)
    jax.distributed.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def process_count(text: str) -> int:
    """The argparse ``type`` of ``--num-processes``: a divisor of ``BATCH`` (each process feeds
    ``BATCH // num_processes`` rows; with another count some rows would be fed by none)."""
    divisors = [n for n in range(1, BATCH + 1) if BATCH % n == 0]
    try:
        value = int(text)
    except ValueError:
        value = None
    if value not in divisors:
        raise argparse.ArgumentTypeError(
            f"--num-processes {text!r}: expected a divisor of the batch of {BATCH} rows: "
            f"{', '.join(map(str, divisors))}"
        )
    return value


def check_same_step(out: pathlib.Path) -> None:
    """``out``'s distributed.npz against single.npz (the expected values), the loss and every
    weight, with the project's tolerance table: SystemExit (exit code 1) naming the first that
    differs."""
    report = compare_steps(np.load(out / "single.npz"), np.load(out / "distributed.npz"))
    if not report.ok:
        raise SystemExit(
            f"the distributed step differs from the one-process step, first at {report.first_divergence}:\n"
            f"{report}"
        )


def launch(num_processes: int, out: pathlib.Path) -> None:
    """Start the workers, wait for them, then take the same step in this one process."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, __file__, "--out", str(out), "--num-processes", str(num_processes)]
    workers = [
        subprocess.Popen([*command, "--process-id", str(i), "--port", str(port)])
        for i in range(num_processes)
    ]
    codes = [worker.wait(timeout=300) for worker in workers]
    if any(codes):
        raise SystemExit(f"worker exit codes {codes}")
    model = make_model()
    loss = train_step(model, make_optimizer(model), *make_batch())
    save_step(out / "single.npz", loss, model)
    distributed = np.load(out / "distributed.npz")
    print(f"loss: {float(distributed['loss']):.6f} over {num_processes} processes, {float(loss):.6f} in one")
    check_same_step(out)
    print("the loss and every weight agree within the tolerance table")


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="python examples/distributed_train.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--num-processes", type=process_count, default=2, help="a divisor of 8 (default 2)")
    parser.add_argument("--process-id", type=int, help="run as this worker (the launcher sets it)")
    parser.add_argument(
        "--port", type=integer("--port", 1, 65535), help="the coordinator's port (the launcher sets it)"
    )
    args = parser.parse_args(argv)
    if args.process_id is not None and args.port is None:  # jax.distributed would dial localhost:None
        parser.error("--process-id needs --port, the coordinator's port")
    if args.port is not None and args.process_id is None:  # the launcher picks its own port
        parser.error("--port needs --process-id: both are a worker's options, set by the launcher")
    if args.process_id is not None and not 0 <= args.process_id < args.num_processes:
        parser.error(
            f"--process-id {args.process_id}: expected 0 to {args.num_processes - 1} "
            f"(--num-processes {args.num_processes})"
        )
    if args.process_id is None:
        launch(args.num_processes, args.out)
    else:
        run_worker(args.process_id, args.num_processes, args.port, args.out)


if __name__ == "__main__":
    main()
