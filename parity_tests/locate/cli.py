"""``attn-parity diff REF.py:NAME CAND.py:NAME --shape B,T,D``: locate on the user's own files.

``NAME`` is a function, a module instance or a class in the file; a class is built with
``--init KEY=VALUE`` (after ``torch.manual_seed(--seed)``). A torch reference's weights (its
``state_dict`` without buffers, as NumPy) go first to a candidate function; ``--option KEY=VALUE``
are keyword arguments for the candidate; ``--gradients`` compares the gradients (the first
diverging backward operation), ``--train`` runs the reference in train mode with its dropout
keep-masks given to a JAX candidate. Exit 0 when every shape matches, 1 when one does not, 2 for
bad usage (a NumPy port with ``--gradients`` included).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys
from typing import Any

__all__ = ["add_diff_parser", "load_object"]


def load_object(spec: str) -> Any:
    """``path/to/file.py:NAME`` -> the object ``NAME`` of that file (its folder importable while it
    loads, so that it can import its neighbours)."""
    path, _, name = spec.rpartition(":")
    if not path.endswith(".py") or not name:
        raise ValueError(f"{spec!r}: expected FILE.py:NAME")
    if not os.path.isfile(path):
        raise ValueError(f"{spec!r}: no file {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    try:
        module_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    if not hasattr(module, name):
        raise ValueError(f"{spec!r}: {path} has no {name!r}")
    return getattr(module, name)


def _pairs(items: list[str], flag: str) -> dict[str, Any]:
    values = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE")
        try:
            values[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            values[key] = text
    return values


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: expected sizes like 2,5,8") from None


def _diff(args: argparse.Namespace) -> int:
    import functools

    from parity_tests.locate.check import locate_shapes

    try:
        reference, candidate = load_object(args.reference), load_object(args.candidate)
        init, options = _pairs(args.init, "--init"), _pairs(args.option, "--option")
    except ValueError as error:
        print(f"attn-parity diff: {error}", file=sys.stderr)
        return 2
    if isinstance(reference, type):
        import torch

        torch.manual_seed(args.seed)
        reference = reference(**init)
    params = _weights(reference)
    if options:
        candidate = functools.partial(candidate, **options)
    try:
        reports = locate_shapes(
            reference, candidate, args.shape, seeds=args.seeds, params=params,
            train=args.train, gradients=args.gradients,
        )  # fmt: skip
    except TypeError as error:  # NumPy has no gradients
        print(f"attn-parity diff: {error}", file=sys.stderr)
        return 2
    from rich.console import Console

    console = Console(width=args.width or (None if sys.stdout.isatty() else 150), highlight=False)
    failed = None
    for (shape, seed), report in reports.items():
        console.print(f"[bold]shape {shape}, seed {seed}[/bold]")
        console.print(report)
        failed = failed or (None if report.ok else report)
    if failed is not None and args.heatmap:
        failed.write_heatmap(args.heatmap)
        console.print(f"heatmap of the first diverging tensor: {args.heatmap}")
    return 0 if failed is None else 1


def _weights(reference: Any) -> dict[str, Any] | None:
    """A torch module's weights in the project's format; None for anything else."""
    from parity_tests.locate.capture_torch import torch_module_of

    module = torch_module_of(reference)
    if module is None:
        return None
    buffers = {name for name, _ in module.named_buffers()}
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items() if k not in buffers}


def add_diff_parser(commands: Any) -> None:
    """Register ``diff`` on the ``attn-parity`` subcommands."""
    diff = commands.add_parser("diff", help="locate the first line where your port diverges from a reference")
    diff.add_argument("reference", help="FILE.py:NAME of the reference (a torch module, class or function)")
    diff.add_argument("candidate", help="FILE.py:NAME of your port (NumPy, JAX, NNX or torch)")
    diff.add_argument("--shape", type=_shape, action="append", required=True, help="input shape, e.g. 2,5,8")
    diff.add_argument("--seeds", type=int, nargs="+", default=[0], help="input seeds (default: 0)")
    diff.add_argument("--seed", type=int, default=0, help="torch seed for building a reference class")
    diff.add_argument("--init", action="append", default=[], help="KEY=VALUE for the reference class")
    diff.add_argument("--option", action="append", default=[], help="KEY=VALUE for the candidate")
    diff.add_argument("--gradients", action="store_true", help="compare the gradients")
    diff.add_argument("--train", action="store_true", help="reference in train mode, its dropout masks given")
    diff.add_argument("--heatmap", help="PNG of the first diverging tensor's error")
    diff.add_argument("--width", type=int, help="console width")
    diff.set_defaults(run=_diff)
