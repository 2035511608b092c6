"""The ``attn-parity`` command line (also ``python -m parity_tests``)."""

from __future__ import annotations

import argparse
import sys

from parity_tests.cases import FUNCTION_NAMES
from parity_tests.report import ALL_DTYPES, RUNNERS, format_table, parity_report, to_json

__all__ = ["main"]


def _report(args: argparse.Namespace) -> int:
    show_progress = sys.stderr.isatty()

    def progress(case_id: str) -> None:
        print(f"\r  checking {case_id:<80}", end="", file=sys.stderr, flush=True)

    rows = parity_report(args.framework, args.dtype, args.layer, progress if show_progress else None)
    if show_progress:
        print("\r" + " " * 92 + "\r", end="", file=sys.stderr)
    print(to_json(rows) if args.json else format_table(rows))
    return 0 if all(row.ok for row in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attn-parity", description="Check attention ports between PyTorch, NumPy and JAX."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser(
        "report", help="every class x framework x dtype against torch_ref; exit 1 on any failure"
    )
    report.add_argument("--json", action="store_true", help="print JSON instead of a table")
    report.add_argument("--framework", action="append", choices=list(RUNNERS), help="repeatable")
    report.add_argument("--dtype", action="append", choices=list(ALL_DTYPES), help="repeatable")
    report.add_argument("--layer", action="append", choices=list(FUNCTION_NAMES), help="repeatable")
    report.set_defaults(run=_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
