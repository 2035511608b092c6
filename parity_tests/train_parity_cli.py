"""``attn-parity train-parity``: train the GPT in torch and JAX side by side, print and plot the losses.

    attn-parity train-parity [--steps N] [--learning-rate LR] [--weight-decay WD] [--dtype D] [--out PNG]

Prints one row per step (torch's loss, JAX's, their difference, within tolerance or not) and
the final weights' worst relative error, writes a PNG of both loss curves and of their
difference against each step's tolerance; exit 1 when a loss
or a final weight differs beyond the tolerance table. Both train in float64 unless ``--dtype
float32``: in float32 AdamW's updates of near-zero gradients can move a correct port's final
weights beyond float32's bound (``parity_tests.training``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from parity_tests.png import pyplot, save_png
from parity_tests.training import TRAIN_DTYPES
from parity_tests.usage import MAX_SEED, integer, number, png_path, writing

__all__ = ["TOY_CONFIG", "ZERO", "add_train_parity_parser", "loss_figure", "write_loss_plot"]

ZERO = 1e-17  # where a loss difference of exactly 0 is drawn on the log axis

# a tiny GPT whose vocabulary holds the toy corpus' characters (36 distinct)
TOY_CONFIG = {
    "vocab_size": 40,
    "context_length": 16,
    "emb_dim": 32,
    "n_heads": 2,
    "n_layers": 2,
    "drop_rate": 0.0,
    "qkv_bias": False,
}


def loss_figure(torch_losses: list[float], jax_losses: list[float], tolerances: list[float]) -> Any:
    """Two panels over the integer steps: both loss curves (torch's a wide pale line, JAX's a thin
    dashed one with crosses on it, so that equal curves both show), and |torch - JAX| on a log axis
    with each step's tolerance (a difference of exactly 0 is drawn at ``ZERO``). Returns the figure."""
    from matplotlib.ticker import MaxNLocator

    steps = range(1, len(torch_losses) + 1)
    figure, (curves, differences) = pyplot().subplots(
        2, 1, figsize=(7, 5.5), sharex=True, layout="constrained", height_ratios=(3, 2)
    )
    curves.plot(steps, torch_losses, "-o", linewidth=5, alpha=0.35, label="torch_ref + torch.optim.AdamW")
    curves.plot(steps, jax_losses, "--x", linewidth=1.2, color="black", label="jax_attn + optax.adamw")
    curves.set_ylabel("next-token cross-entropy")
    curves.set_title("GPT training parity")
    curves.legend()
    gaps = np.abs(np.asarray(torch_losses, np.float64) - np.asarray(jax_losses, np.float64))
    differences.semilogy(
        steps, np.maximum(gaps, ZERO), "o-", color="tab:red", label="|torch loss - jax loss|"
    )
    differences.plot(steps, tolerances, ":", color="black", label="tolerance (atol + rtol x |torch loss|)")
    differences.set_ylabel(f"|difference| (0 drawn at {ZERO:.0e})")
    differences.set_xlabel("step")
    differences.legend(fontsize=8)
    differences.xaxis.set_major_locator(MaxNLocator(integer=True))
    return figure


def write_loss_plot(
    torch_losses: list[float], jax_losses: list[float], tolerances: list[float], path: str
) -> None:
    """``loss_figure`` written to ``path`` (``save_png``: a ValueError, never a blocked open, for a
    FIFO or a device)."""
    save_png(loss_figure(torch_losses, jax_losses, tolerances), path)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from parity_tests.training import Hyperparameters, train_parity

    out = png_path(args.out, "train_parity.png")  # before training: a bad path is a usage error
    hp = Hyperparameters(
        steps=args.steps, learning_rate=args.learning_rate, weight_decay=args.weight_decay, seed=args.seed
    )
    result = train_parity(TOY_CONFIG, hp, dtype=args.dtype)
    title = (
        f"GPT {TOY_CONFIG} trained {hp.steps} steps in {args.dtype}, AdamW lr={hp.learning_rate:g}, "
        f"weight decay {hp.weight_decay:g}"
    )
    table = Table(title=title, title_justify="left")
    for column in ("step", "torch loss", "jax loss", "|difference|", "ok"):
        table.add_column(column, justify="right")
    for step, (expected, actual, row) in enumerate(
        zip(result.torch.losses, result.jax.losses, result.losses.rows, strict=True), 1
    ):
        ok = "yes" if row.ok else "[bold red]NO"
        table.add_row(str(step), f"{expected:.6f}", f"{actual:.6f}", f"{abs(expected - actual):.1e}", ok)
    console = Console(width=args.width or (None if sys.stdout.isatty() else 150), highlight=False)
    console.print(table)
    worst = max(result.weights.rows, key=lambda row: row.max_rel_err)
    verdict = (
        "[green]match"
        if result.weights.ok
        else f"[bold red]differ (first: {result.weights.first_divergence})"
    )
    console.print(f"final weights {verdict}[/]: worst relative error {worst.max_rel_err:.1e} ({worst.step})")
    rows = zip(result.losses.rows, result.torch.losses, strict=True)
    tolerances = [row.atol + row.rtol * abs(loss) for row, loss in rows]  # each step's bound
    with writing(out):
        write_loss_plot(result.torch.losses, result.jax.losses, tolerances, out)
    console.print(f"wrote {out}")
    return 0 if result.ok else 1


def add_train_parity_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``train-parity`` on the CLI's subcommands."""
    parser = commands.add_parser(
        "train-parity", help="train the GPT in torch and JAX on the same batches; compare losses and weights"
    )
    parser.add_argument("--steps", type=integer("--steps", 1, 10_000), default=20, help="training steps")
    parser.add_argument(
        "--learning-rate",
        type=number("--learning-rate", 0.0, 1.0, low_included=False),
        default=3e-3,
        help="AdamW learning rate, above 0 and at most 1 (default 3e-3)",
    )
    parser.add_argument(
        "--weight-decay",
        type=number("--weight-decay", 0.0, 1.0),
        default=0.1,
        help="AdamW weight decay, from 0 to 1 (default 0.1)",
    )
    parser.add_argument(
        "--seed",
        type=integer("--seed", 0, MAX_SEED),
        default=0,
        help="seeds the initial weights and the batches",
    )
    parser.add_argument(
        "--dtype",
        choices=TRAIN_DTYPES,
        default="float64",
        help="both sides train in it (default float64: in float32 AdamW's updates of near-zero "
        "gradients can move a correct port's final weights beyond float32's tolerance)",
    )
    parser.add_argument(
        "--out", default="train_parity.png", help="the loss curves, a PNG (in a folder: train_parity.png)"
    )
    parser.set_defaults(run=_run)
