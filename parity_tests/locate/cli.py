"""``attn-parity diff REF.py:NAME CAND.py:NAME --shape B,T,D``: ``check_port`` on the user's own files.

For each shape and seed it prints ``check_port``'s report: the step table where both sides record
steps (a port taking ``return_steps`` or returning ``(output, steps)``), and ``locate``'s report of
the candidate's first diverging line where the steps do not pinpoint the divergence (a port
recording none).

``NAME`` is a function, a module instance or a class in the file; a class (the reference's and
the candidate's alike) is built with ``--init KEY=VALUE`` after ``torch.manual_seed(--seed)``, a
Flax NNX class taking ``rngs`` also with ``rngs=nnx.Rngs(--seed)``. A torch reference's weights (its
``state_dict`` without buffers, as NumPy) go first to a candidate function (plain, jitted or
decorated; a module or other callable object, such as a class's instance, holds its own weights and
is called on the input alone); ``--option KEY=VALUE``
are keyword arguments for the candidate; the inputs are standard normal floats of each ``--shape``,
or with ``--tokens VOCAB`` token ids drawn from ``[0, VOCAB)`` (a whole language model);
``--framework`` and ``--reference-framework`` (torch, numpy, jax) override the framework ``locate``
reads from the candidate's and the reference's code; ``--gradients`` also compares the gradients
(the first diverging backward operation), ``--train`` runs the reference in train mode with its
dropout keep-masks given to the candidate: the options of ``check_port``. Exit 0 when every shape
matches, 1 when one does not (a candidate that raises is a port that diverges: the report names its
line raising, the exception and the last value it still agreed on), 2 for bad usage, with one line
on stderr (also 2, one line, for an exception the checker's own code raises: no finding about the
port): a file that does not load, a name it lacks or that is not a function, module or class, a
class refusing the ``--init`` values, a size below 1, an input making an array past 2**27 entries
(one head's scores; with ``--tokens`` also the logits ``(B, T, VOCAB)``), a seed outside 0 to
2**32 - 1, a ``--tokens`` outside 1 to 2**31 - 1, a reference that raises on an input of the shape
asked for, a NumPy port with ``--gradients``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import os
import sys
from typing import Any

from parity_tests.usage import MAX_SEED, UsageError, check_sizes, integer, png_path, writing

__all__ = ["add_diff_parser", "build", "load_object"]

FRAMEWORKS = ["torch", "numpy", "jax"]  # what locate runs a callable in
MAX_VOCAB = 2**31 - 1  # token ids fit int32 (JAX's default integers)


def load_object(spec: str) -> Any:
    """``path/to/file.py:NAME`` -> the object ``NAME`` of that file (its folder importable while it
    loads, so that it can import its neighbours). ValueError for a file that does not exist or
    fails to load (a syntax error, an exception while it runs), for a name it lacks and for one
    that is not callable (a function, a module or a class); a module it imports that is not
    installed raises ModuleNotFoundError (the CLI names the extra)."""
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
    except ModuleNotFoundError:
        raise
    except Exception as error:
        raise ValueError(f"{spec!r}: {path} does not load: {type(error).__name__}: {error}") from None
    finally:
        sys.path.remove(folder)
    if not hasattr(module, name):
        raise ValueError(f"{spec!r}: {path} has no {name!r}")
    value = getattr(module, name)
    if not callable(value):
        raise ValueError(
            f"{spec!r}: {name!r} in {path} is of type {type(value).__name__}, not callable: expected a "
            "function, a module or a class"
        )
    return value


def build(spec: str, value: Any, init: dict[str, Any], seed: int) -> Any:
    """``value`` (the object ``spec`` names) as ``diff`` calls it: a class is built with ``init``
    after ``torch.manual_seed(seed)`` (a Flax NNX class whose constructor takes ``rngs`` and is
    not given it also with ``rngs=nnx.Rngs(seed)``), so that two classes creating the same
    weights in the same order hold the same values; anything else as it is. UsageError (one line)
    for a class whose constructor refuses ``init``: any exception it raises (a TypeError, an
    ``assert``, torch's RuntimeError for a negative size) is the user's constructor refusing."""
    if not isinstance(value, type):
        return value
    import torch

    nnx = sys.modules.get("flax.nnx")
    arguments = dict(init)
    if nnx is not None and issubclass(value, nnx.Module) and "rngs" not in arguments:
        if "rngs" in inspect.signature(value.__init__).parameters:  # NNX's metaclass hides it on the class
            arguments["rngs"] = nnx.Rngs(seed)
    torch.manual_seed(seed)
    try:
        return value(**arguments)
    except Exception as error:
        given = "".join(f" {key}={text!r}" for key, text in init.items())
        raise UsageError(f"{spec}{given}: {type(error).__name__}: {error}") from None


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
    """``B,T,D`` -> the input shape: sizes of at least 1, the input not past ``MAX_ENTRIES`` entries
    (the arrays it makes: ``_check_arrays``)."""
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: expected sizes like 2,5,8") from None
    try:
        check_sizes("--shape", text, shape, [shape])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return shape


def _check_arrays(shapes: list[tuple[int, ...]], vocab: int | None) -> None:
    """UsageError where an input of one of ``shapes`` makes an array past ``MAX_ENTRIES`` entries:
    one head's scores, ``(B, T, T)`` for floats ``(B, T, D)``; for token ids ``(B, T)`` (``vocab``
    given) the scores ``(B, T, T)`` and the logits ``(B, T, VOCAB)``."""
    for shape in shapes:
        text = ",".join(map(str, shape))
        if vocab is not None:
            arrays, given = [(*shape, shape[-1]), (*shape, vocab)], f" (token ids, --tokens {vocab})"
        else:
            arrays, given = [(*shape[:-1], shape[-2]) if len(shape) > 1 else shape], ""
        try:
            check_sizes("--shape", text, shape, arrays)
        except ValueError as error:
            raise UsageError(f"argument --shape: {error}{given}") from None


def _diff(args: argparse.Namespace) -> int:
    import functools

    from parity_tests.locate.check import drawn_inputs, locate
    from parity_tests.locate.report import NO_HEATMAP
    from parity_tests.locate.run import NoGradients
    from parity_tests.locate.trace import Raised
    from parity_tests.port import check_port

    heatmap = None if args.heatmap is None else png_path(args.heatmap, "first_divergence.png")
    _check_arrays(args.shape, args.tokens)
    try:
        reference, candidate = load_object(args.reference), load_object(args.candidate)
        init, options = _pairs(args.init, "--init"), _pairs(args.option, "--option")
    except ValueError as error:
        raise UsageError(error) from None
    reference = build(args.reference, reference, init, args.seed)
    candidate = build(args.candidate, candidate, init, args.seed)
    params = _weights(reference)
    if options:
        candidate = functools.partial(candidate, **options)
    how = {  # how check_port and locate run the two
        "params": params,
        "train": args.train,
        "reference_framework": args.reference_framework,
        "candidate_framework": args.framework,
    }
    reports, failed = {}, None
    for (shape, seed), x in drawn_inputs(args.shape, args.seeds, vocab=args.tokens):
        try:
            reports[(shape, seed)] = check_port(reference, candidate, x, gradients=args.gradients, **how)
        except NoGradients as error:  # --gradients of a NumPy callable
            raise UsageError(error) from None
        except Raised as raised:  # the candidate's raising is a report: this is the reference's
            raise UsageError(
                f"the reference {args.reference} raises on an input of shape {shape}: {raised}"
            ) from None
        except Exception as error:
            _checker_fault(error, f"shape {shape}, seed {seed}")
            raise  # the user's code raised (a port raising as check_port calls it)
        if failed is None and not reports[(shape, seed)].ok:
            failed = reports[(shape, seed)].located, x
    from rich.console import Console

    console = Console(width=args.width or (None if sys.stdout.isatty() else 150), highlight=False)
    for (shape, seed), report in reports.items():
        console.print(f"[bold]shape {shape}, seed {seed}[/bold]")
        console.print(report)
    if failed is not None and heatmap:
        located, x = failed
        if located is None:  # the steps named the divergence: the values to draw are locate's
            try:
                located = locate(reference, candidate, x, **how)
            except Exception as error:
                _checker_fault(error, "the heatmap's run")
                raise
        if located.ok:
            console.print("no heatmap: the outputs match (locate), only the steps differ")
        elif located.expected_value is None:
            console.print(f"no heatmap: {'the candidate raised' if located.raised else NO_HEATMAP}")
        else:
            with writing(heatmap):
                located.write_heatmap(heatmap)
            console.print(f"heatmap of the first diverging tensor: {heatmap}")
    return 0 if failed is None else 1


def _checker_fault(error: Exception, where: str) -> None:
    """Raise ``UsageError`` (one line, exit 2) where ``error`` comes from the checker's own code:
    the last frame of its traceback in ``parity_tests`` or in a user's file (the port, the
    reference, the project's packages) is ``parity_tests``'; return where the user's code raised it.
    Exit 1 says the port diverges: a fault of the checker must not read as one."""
    import traceback

    from parity_tests.locate.trace import is_user_file

    checker = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if is_user_file(f.filename) or os.path.realpath(f.filename).startswith(checker)
    ]
    if frames and os.path.realpath(frames[-1].filename).startswith(checker):
        root = os.path.dirname(checker.rstrip(os.sep))
        at = f"{os.path.relpath(os.path.realpath(frames[-1].filename), root)}:{frames[-1].lineno}"
        message = " ".join(f"{type(error).__name__}: {error}".split())
        raise UsageError(
            f"internal error of the checker ({where}), not a finding about the port: {message} "
            f"(at {at}); please report it"
        ) from error


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
    diff = commands.add_parser(
        "diff",
        help="check your port against a reference: its steps, and the first line where it diverges "
        "(exit 1: it diverges or raises)",
    )
    diff.add_argument("reference", help="FILE.py:NAME of the reference (a torch module, class or function)")
    diff.add_argument("candidate", help="FILE.py:NAME of your port (NumPy, JAX, NNX or torch)")
    diff.add_argument("--shape", type=_shape, action="append", required=True, help="input shape, e.g. 2,5,8")
    diff.add_argument(
        "--seeds",
        type=integer("--seeds", 0, MAX_SEED),
        nargs="+",
        default=[0],
        help="input seeds (default: 0)",
    )
    diff.add_argument(
        "--seed",
        type=integer("--seed", 0, MAX_SEED),
        default=0,
        help="torch seed (and NNX rngs) for building a class",
    )
    diff.add_argument(
        "--init", action="append", default=[], help="KEY=VALUE for building a class (reference or candidate)"
    )
    diff.add_argument("--option", action="append", default=[], help="KEY=VALUE for the candidate")
    diff.add_argument(
        "--tokens",
        type=integer("--tokens", 1, MAX_VOCAB),
        metavar="VOCAB",
        help="feed token ids drawn from [0, VOCAB) of the --shape (B,T) instead of floats (a whole model)",
    )
    diff.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        help="the candidate's framework, where the one read from it is wrong",
    )
    diff.add_argument("--reference-framework", choices=FRAMEWORKS, help="the reference's, likewise")
    diff.add_argument("--gradients", action="store_true", help="compare the gradients")
    diff.add_argument("--train", action="store_true", help="reference in train mode, its dropout masks given")
    diff.add_argument(
        "--heatmap", help="PNG of the first diverging tensor's error (first_divergence.png in a folder)"
    )
    diff.set_defaults(run=_diff)
