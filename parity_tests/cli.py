"""The ``attn-parity`` command line (also ``python -m parity_tests``).

    attn-parity report [--json] [--framework F] [--dtype D] [--layer L]
    attn-parity trace CLASS|GPTModel [--framework F] [--dtype D] [--shape S]
    attn-parity walkthrough [--stage NAME] [--list]
    attn-parity heatmap CLASS|GPTModel [--out PATH]
    attn-parity bench [--shape S ...] [--implementation I ...] [--rounds N] [--out DIR] [--readme FILE]
    attn-parity train-parity [--steps N] [--out PNG]
    attn-parity diff REF.py:NAME CAND.py:NAME --shape B,T,D [--seeds N ...] [--init K=V] [--tokens VOCAB]
                     [--framework F] [--reference-framework F] [--gradients] [--train] [--heatmap PNG]

Exit codes: 0 when everything compared matches, 1 when something does not (``diff``: a candidate
that raises, too), 2 for bad usage (one line on stderr, no traceback): a bad argument (an integer
option out of its range included: --seeds and --seed 0 to 2**32 - 1, --rounds 1 to 1000, --steps
1 to 10000, --width 40 to 1000), heads that do not divide the width, an output folder that does
not exist or is not a folder, a ``bench --readme`` file that does not exist, cannot be written or
lacks the bench markers, a dtype no chosen framework computes in, or a command that
needs a framework that is not installed (torch, jax: install the extra it names).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable

from numpy_attn import __version__
from numpy_attn.spec import SPECS
from parity_tests.cases import SHAPES
from parity_tests.frameworks import ALL_DTYPES, DTYPES, RUNNERS
from parity_tests.locate.cli import add_diff_parser
from parity_tests.train_parity_cli import add_train_parity_parser
from parity_tests.usage import (
    OneLineParser,
    UsageError,
    check_folder,
    check_writable,
    console_width,
    integer,
    png_path,
    writing,
)

__all__ = ["UsageError", "build_parser", "main"]

# the packages a command may import (each in an extra; `pip install ".[all]"` installs them all)
OPTIONAL = ("torch", "ml_dtypes", "jax", "flax", "optax", "rich", "matplotlib", "threadpoolctl")
INSTALL = 'pip install ".[all]"'


def _uses_jax(names: list[str] | None) -> bool:
    """Whether the chosen frameworks or implementations (None: all of them) include a JAX one."""
    return names is None or any(name.startswith(("jax", "flax")) for name in names)


def _needs(args: argparse.Namespace) -> list[str]:
    """The optional packages ``args.command`` imports (``diff``: those of the files it loads, found
    when it loads them)."""
    option = vars(args)
    jax = ["jax", "flax"]
    needs = {
        "report": ["torch", *jax * _uses_jax(option.get("framework"))],
        "trace": ["torch", *jax * _uses_jax(option.get("framework")), "rich"],
        "walkthrough": [] if option.get("list") else ["torch", *jax, "rich"],
        "heatmap": ["torch", *jax, "matplotlib"],
        "bench": ["torch", *jax * _uses_jax(option.get("implementation")), "matplotlib", "threadpoolctl"],
        "train-parity": ["torch", *jax, "optax", "matplotlib", "rich"],
        "diff": ["rich"],
    }
    return needs[args.command]


def _installed(name: str) -> bool:
    if name in sys.modules:  # None where an import of it failed (or a test made it fail)
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def _missing_message(missing: list[str]) -> str:
    names = missing[0] if len(missing) == 1 else f"{', '.join(missing[:-1])} and {missing[-1]}"
    verb = "is" if len(missing) == 1 else "are"
    return f"this command needs {names}, which {verb} not installed: {INSTALL}"


def _console(args: argparse.Namespace, piped_width: int = 150):
    from rich.console import Console

    width = args.width or (None if sys.stdout.isatty() else piped_width)  # files and pipes
    return Console(width=width, highlight=False)


def _progress_bar(
    total: int | None, stage: Callable[[str], str]
) -> tuple[Callable[[str], None], Callable[[], None]]:
    """A rich progress bar on stderr when it is a terminal (a spinner with the current step when
    ``total`` is None); otherwise (a pipe, a file, CI's log) one line on stderr as each stage starts,
    ``stage`` naming the stage of a step."""
    if not sys.stderr.isatty():
        started: list[str] = []

        def line(step: str) -> None:
            if not started or stage(step) != started[-1]:
                started.append(stage(step))
                print(f"{started[-1]} ...", file=sys.stderr, flush=True)

        return line, (lambda: None)
    from rich.console import Console
    from rich.progress import Progress

    progress = Progress(console=Console(stderr=True), transient=True)
    task = progress.add_task("comparing", total=total)
    progress.start()
    return (lambda step: progress.update(task, advance=1, description=step)), progress.stop


def _case_stage(case_id: str) -> str:
    """A report's stage: one class in one dtype (``MultiHeadAttention-B2-...-float32``)."""
    parts = case_id.split("-")
    return f"report: {parts[0]} in {parts[-1]}"


def _report(args: argparse.Namespace) -> int:
    from parity_tests.report import format_table, parity_report, to_json

    layers = args.layer or list(SPECS)
    frameworks = args.framework or list(RUNNERS)
    dtypes = args.dtype or list(ALL_DTYPES)
    computed = [d for d in dtypes if any(d in DTYPES[f] for f in frameworks)]
    if not computed:
        raise UsageError(f"{', '.join(frameworks)} compute(s) in none of the dtypes {', '.join(dtypes)}")
    total = len(layers) * len(computed) * len(SHAPES) * 2  # every shape, bias off and on
    advance, stop = _progress_bar(total, _case_stage)
    try:
        rows = parity_report(frameworks, dtypes, layers, advance)
    finally:
        stop()
    print(to_json(rows) if args.json else format_table(rows))
    return 0 if all(row.ok for row in rows) else 1


def _trace(args: argparse.Namespace) -> int:
    from rich.table import Table

    from parity_tests.trace import GPT, parse_shape, trace_case, trace_gpt

    frameworks = tuple(args.framework) if args.framework else None
    if args.layer == GPT:
        if args.dtype != "float32" or args.shape is not None:
            raise UsageError("GPTModel is traced as the book runs it: float32, its token ids (no --shape)")
        trace = trace_gpt(frameworks)
    else:
        try:
            case = parse_shape(args.layer, args.shape or "full_context", args.dtype)
        except ValueError as error:
            raise UsageError(str(error)) from None
        unsupported = [f for f in args.framework or () if args.dtype not in DTYPES[f]]
        if unsupported:
            raise UsageError(f"{', '.join(unsupported)} do(es) not compute in {args.dtype}")
        trace = trace_case(case, frameworks)
    frameworks = tuple(trace.reports)
    table = Table(title=f"{trace.title}: each step against torch_ref", title_justify="left")
    table.add_column("step", no_wrap=True)
    table.add_column("shape (torch_ref)", no_wrap=True)
    for framework in frameworks:
        table.add_column(f"{framework}\nmax abs · rel err", justify="right", no_wrap=True)
    for index, step in enumerate(trace.expected):
        cells, divergent = [step, str(tuple(trace.expected[step].shape))], False
        for framework in frameworks:
            report = trace.reports[framework]
            row = report.rows[index]
            divergent |= report.first_divergence == step
            if row.note:  # a shape mismatch or a missing step
                cells.append(f"[bold red]{row.note} {row.actual_shape}")
            else:
                mark = "" if row.ok else "[bold red]"
                cells.append(f"{mark}{row.max_abs_err:.1e} · {row.max_rel_err:.1e}")
        table.add_row(*cells, style="on dark_red" if divergent else None)
    console = _console(args)
    console.print(table)
    for framework, report in trace.reports.items():
        verdict = (
            "[green]every step matches"
            if report.ok
            else f"[bold red]first divergence: {report.first_divergence}"
        )
        rtol, atol = report.rows[0].rtol, report.rows[0].atol
        console.print(f"{framework}: {verdict}[/] (tolerance rtol={rtol:.0e}, atol={atol:.0e})")
    return 0 if trace.ok else 1


def _walkthrough(args: argparse.Namespace) -> int:
    from parity_tests.walkthrough import STAGES

    if args.list:  # plain text: NumPy alone lists the stages
        for stage in STAGES:
            print(f"{stage.name:<24} {stage.section}")
        return 0
    from rich.text import Text

    console = _console(args, piped_width=100)
    stages = [s for s in STAGES if args.stage in (None, s.name)]
    if not stages:
        raise UsageError(f"unknown stage {args.stage!r}; see --list")
    from parity_tests.lesson.panel import shown_panel

    all_match = True
    for number, stage in enumerate(stages, start=STAGES.index(stages[0]) + 1):
        show = stage.function()  # first: without a framework, the one error line is all the output
        console.rule(Text(f"{number}. {stage.section}  ({stage.name})", style="bold"))
        console.print(Text(stage.text))
        console.file.flush()  # a line per stage as it starts, also into a pipe
        for shown in show():
            console.print(shown_panel(shown))
            all_match &= shown.ok
        console.file.flush()
    return 0 if all_match else 1


def _heatmap(args: argparse.Namespace) -> int:
    from parity_tests.heatmap import GPT, write_heatmap

    path = png_path(args.out, "heatmap.png")
    with writing(path):
        maps = write_heatmap(args.layer, path)
    shape = maps["torch"].shape
    heads = f"{shape[0]} layers x {shape[1]} heads" if args.layer == GPT else f"{shape[0]} head(s)"
    print(f"wrote {path}: {args.layer}, {heads}, max |difference| {maps['units'].max():.1e} x the tolerance")
    return 0


def _check_readme(path: str) -> None:
    """``bench --readme``, before any work: an existing regular file this process can write
    (``check_writable``) that holds the bench markers in order (``table_span``)."""
    from parity_tests.bench.output import table_span

    if not os.path.exists(path):
        raise UsageError(f"{path} does not exist")
    check_writable(path)
    try:
        with open(path) as file:
            table_span(file.read())
    except (OSError, ValueError) as error:  # unreadable, not text, or no markers
        raise UsageError(f"{path}: {error}") from None


def _bench(args: argparse.Namespace) -> int:
    import tempfile

    from parity_tests.bench.output import markdown_table, update_readme, write_chart, write_json
    from parity_tests.bench.run import run_benchmark

    if args.out is not None:
        check_folder(args.out)
        for name in ("results.json", "results.png"):
            check_writable(os.path.join(args.out, name))
    if args.readme is not None:
        _check_readme(args.readme)
    advance, stop = _progress_bar(None, lambda step: f"bench: {step.split(':')[0]}")
    try:
        results = run_benchmark(
            args.shape, args.implementation, args.rounds, memory=not args.no_memory,
            decode=not args.no_decode, progress=advance,
        )  # fmt: skip
    finally:
        stop()
    # the default folder is made once there are results: a run that fails leaves none behind
    out = tempfile.mkdtemp(prefix="attn-parity-bench-") if args.out is None else args.out
    for name, write in (("results.json", write_json), ("results.png", write_chart)):
        with writing(os.path.join(out, name)):  # replaced since the check, or a full disk: one line
            write(results, os.path.join(out, name))
    if args.readme is not None:
        with writing(args.readme):  # replaced or edited since _check_readme: one line
            update_readme(results, args.readme)
    print(markdown_table(results))
    print(f"wrote {os.path.join(out, 'results.json')} and results.png")
    return 0


WIDTH_HELP = "width of tables and reports, 40 to 1000 columns (default: the terminal's; 150 in a pipe)"
CLASSES_HELP = f"one of {', '.join([*SPECS, 'GPTModel'])}"
SHAPES_HELP = (
    "B,T,D_IN,D_OUT,N (batch, tokens, input width, output width, heads) or a named shape: "
    + ", ".join(f"{name} ({','.join(map(str, (b, t, d_in, d_out, n)))})"
                for name, (b, t, _, d_in, d_out, n) in SHAPES.items())
    + " (default full_context)"
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="attn-parity", description="Check attention ports between PyTorch, NumPy and JAX."
    )
    parser.add_argument("--version", action="version", version=f"attn-parity {__version__}")
    parser.add_argument("--width", type=console_width, default=None, help=WIDTH_HELP)
    commands = parser.add_subparsers(dest="command")

    report = commands.add_parser(
        "report",
        help="every class x framework x dtype against torch_ref; exit 1 on any failure (about 2 minutes on "
        "2 cores; a line per class and dtype on stderr when it is no terminal)",
    )
    report.add_argument("--json", action="store_true", help="print JSON instead of a table")
    report.add_argument("--framework", action="append", choices=list(RUNNERS), help="repeatable")
    report.add_argument("--dtype", action="append", choices=list(ALL_DTYPES), help="repeatable")
    report.add_argument("--layer", action="append", choices=list(SPECS), help="repeatable")
    report.set_defaults(run=_report)

    trace = commands.add_parser(
        "trace",
        help="one class, each step side by side with torch_ref (GPTModel: the book's GPT on its token ids, "
        "every block's steps, about 15 s)",
    )
    trace.add_argument("layer", choices=[*SPECS, "GPTModel"], metavar="CLASS", help=CLASSES_HELP)
    trace.add_argument("--framework", action="append", choices=list(RUNNERS), help="repeatable")
    trace.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    trace.add_argument("--shape", help=SHAPES_HELP)
    trace.set_defaults(run=_trace)

    walkthrough = commands.add_parser(
        "walkthrough",
        help="the book's chapters 3 and 4 section by section in three frameworks, with what the notes print "
        "(about 25 s on 2 cores, 20 s of it the GPT stage; a line per stage as it starts)",
    )
    walkthrough.add_argument("--stage", help="show one stage (see --list)")
    walkthrough.add_argument("--list", action="store_true", help="list the stages")
    walkthrough.set_defaults(run=_walkthrough)

    heatmap = commands.add_parser(
        "heatmap",
        help="a PNG of the attention weights per head (GPTModel: the book's GPT, layers x heads, about 15 s) "
        "and NumPy's and JAX's differences from them in tolerance units",
    )
    heatmap.add_argument("layer", choices=[*SPECS, "GPTModel"], metavar="CLASS", help=CLASSES_HELP)
    heatmap.add_argument("--out", default="heatmap.png", help="the PNG to write (heatmap.png in a folder)")
    heatmap.set_defaults(run=_heatmap)

    from parity_tests.bench.implementations import IMPLEMENTATIONS, SHAPES

    bench = commands.add_parser("bench", help="time and memory of every implementation (slow)")
    bench.add_argument("--shape", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    bench.add_argument(
        "--implementation", nargs="+", default=list(IMPLEMENTATIONS), choices=list(IMPLEMENTATIONS),
        help="torch_sdpa, the baseline of every ratio and of the chart, is always timed",
    )  # fmt: skip
    bench.add_argument(
        "--rounds", type=integer("--rounds", 1, 1000), default=5, help="round-robin rounds (medians)"
    )
    bench.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory runs")
    bench.add_argument("--no-decode", action="store_true", help="skip the KV-cache decoding runs")
    bench.add_argument(
        "--out", help="an existing folder for results.json and results.png (default: a new temporary "
        "folder; the committed results are rewritten only when --out names benchmarks)",
    )  # fmt: skip
    bench.add_argument(
        "--readme", help="update this README's table between the bench markers (checked before the run)"
    )
    bench.set_defaults(run=_bench)
    add_diff_parser(commands)
    add_train_parity_parser(commands)
    for command in commands.choices.values():  # before or after the command: the same option
        command.add_argument("--width", type=console_width, default=argparse.SUPPRESS, help=WIDTH_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; bad usage and missing packages exit 2 with one line on stderr (a bare call:
    the usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    missing = [name for name in _needs(args) if not _installed(name)]
    try:
        if missing:
            raise UsageError(_missing_message(missing))
        code = args.run(args)
        sys.stdout.flush()  # a full disk or a closed pipe fails here, not at the interpreter's exit
        return code
    except UsageError as error:
        print(f"attn-parity {args.command}: error: {error}", file=sys.stderr)
    except ModuleNotFoundError as error:  # a package a file given to ``diff`` imports
        top = (error.name or "").split(".")[0]
        if top not in OPTIONAL:
            raise
        print(f"attn-parity {args.command}: error: {_missing_message([top])}", file=sys.stderr)
    except OSError as error:  # the output could not be written (a full disk; a closed pipe, `| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at the interpreter's exit
        if not isinstance(error, BrokenPipeError):  # the reader stopped reading: nothing more to say
            print(f"attn-parity {args.command}: error: {error}", file=sys.stderr)
        return 1
    return 2
