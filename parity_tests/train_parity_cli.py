"""``attn-parity train-parity``: train the GPT in torch and JAX side by side, print and plot the losses.

    attn-parity train-parity [--steps N] [--learning-rate LR] [--weight-decay WD] [--dtype D] [--out PNG]

Prints one row per step (torch's loss, JAX's, their difference, within tolerance or not) and
the final weights' worst relative error, writes a PNG of both loss curves; exit 1 when a loss
or a final weight differs beyond the tolerance table. Both train in float64 unless ``--dtype
float32``: in float32 AdamW's updates of near-zero gradients can move a correct port's final
weights beyond float32's bound (``parity_tests.training``).
"""

from __future__ import annotations

import argparse
import sys

from parity_tests.png import pyplot, save_png
from parity_tests.training import TRAIN_DTYPES
from parity_tests.usage import MAX_SEED, integer, number, png_path, writing

__all__ = ["TOY_CONFIG", "add_train_parity_parser", "write_loss_plot"]

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


def write_loss_plot(torch_losses: list[float], jax_losses: list[float], path: str) -> None:
    """A PNG of both loss curves against the step, written to ``path`` (``save_png``: a ValueError,
    never a blocked open, for a FIFO or a device)."""
    steps = range(1, len(torch_losses) + 1)
    figure, axes = pyplot().subplots(figsize=(6, 3.5))
    axes.plot(steps, torch_losses, "o-", label="torch_ref + torch.optim.AdamW")
    axes.plot(steps, jax_losses, "x--", label="jax_attn + optax.adamw")
    axes.set_xlabel("step")
    axes.set_ylabel("next-token cross-entropy")
    axes.set_title("GPT training parity")
    axes.legend()
    figure.tight_layout()
    save_png(figure, path)


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
    with writing(out):
        write_loss_plot(result.torch.losses, result.jax.losses, out)
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
