"""The benchmark's outputs: JSON on disk, a PNG chart, and the README table made from the JSON."""

from __future__ import annotations

import json
import os
from typing import Any

from numpy_attn.files import atomic_write
from parity_tests.png import pyplot, save_png

__all__ = [
    "chart_figure",
    "format_time",
    "markdown_table",
    "table_span",
    "update_readme",
    "write_chart",
    "write_json",
]

README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


def write_json(results: dict[str, Any], path: str | os.PathLike) -> None:
    """``results`` as JSON in ``path``, replaced atomically (``atomic_write``); ValueError where
    ``path`` exists and is not a regular file (a FIFO would block the open)."""
    with atomic_write(path) as file:
        file.write(json.dumps(results, indent=2).encode())


def format_time(seconds: float) -> str:
    return (
        f"{seconds * 1e6:.1f} µs"
        if seconds < 1e-3
        else f"{seconds * 1e3:.1f} ms"
        if seconds < 1
        else f"{seconds:.2f} s"
    )


def markdown_table(results: dict[str, Any]) -> str:
    """The README's benchmark table, from the JSON alone."""
    machine = results["machine"]
    lines = [
        f"Measured by `{results['command'] or 'attn-parity bench'}` on {machine['cpus']} CPU cores "
        f"({machine['platform']}; numpy {machine['numpy']}, torch {machine['torch']}, jax "
        f"{machine['jax']}), {results['dtype']}, {results['layer']}; medians of {results['rounds']} "
        f"round-robin rounds. float32 GEMM peak in the same run: {results['gemm_peak_gflops']:.0f} "
        "GFLOP/s. Extra memory: peak RSS of one call (JIT compile included) minus RSS before it, "
        "in a fresh process that imports one framework.",
        "",
        "| shape | implementation | time | GFLOP/s | % of GEMM peak | vs torch SDPA | extra memory |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in results["results"]:
        if "skipped" in row:
            lines.append(f"| {row['shape']} | {row['implementation']} | skipped: {row['skipped']} | | | | |")
            continue
        memory = row.get("extra_memory_bytes")
        memory = "" if memory is None else f"{memory / 2**30:.2f} GiB"
        lines.append(
            f"| {row['shape']} | {row['implementation']} | {format_time(row['median_s'])} | "
            f"{row['gflops']:.1f} | {row['pct_of_gemm_peak']:.0f} % | "
            f"{row['ratio_to_torch_sdpa']:.2f}x | {memory} |"
        )
    if results["decode"]:
        header = "| KV-cache decoding, T = 1024 | cached tokens/s | recompute-prefix tokens/s | speed-up |"
        lines += ["", header, "| --- | ---: | ---: | ---: |"]
        for row in results["decode"]:
            lines.append(
                f"| {row['framework']} | {row['cached_tokens_per_s']:.0f} | "
                f"{row['recompute_tokens_per_s']:.1f} | {row['speedup']:.0f}x |"
            )
    return "\n".join(lines)


def table_span(text: str) -> tuple[int, int]:
    """Where a README's benchmark table lies in ``text``: from the end of ``README_START`` to the
    first ``README_END`` after it; ValueError when there is no such pair of markers."""
    start = text.find(README_START)
    end = -1 if start < 0 else text.find(README_END, start + len(README_START))
    if end < 0:
        raise ValueError(f"no {README_START} marker followed by {README_END} to hold the table")
    return start + len(README_START), end


def update_readme(results: dict[str, Any], path: str | os.PathLike) -> None:
    """Replace the README's table between the bench markers with one made from ``results``
    (``table_span``), replacing the file atomically (``atomic_write``)."""
    with open(path) as file:
        text = file.read()
    start, end = table_span(text)
    with atomic_write(path) as file:
        file.write((text[:start] + "\n" + markdown_table(results) + "\n" + text[end:]).encode())


def chart_figure(results: dict[str, Any]) -> Any:
    """Time relative to torch SDPA per shape and implementation on a log axis (lower is better): each
    implementation has one colour in every chart (its place in ``IMPLEMENTATIONS``), a skipped one an
    empty hatched slot with an x, and the legend sits outside the bars. Returns the figure."""
    from parity_tests.bench.implementations import IMPLEMENTATIONS

    rows = results["results"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    names = list(dict.fromkeys(r["implementation"] for r in rows))
    colours = pyplot().get_cmap("tab20").colors
    colour = {name: colours[i % len(colours)] for i, name in enumerate(IMPLEMENTATIONS)}
    timed = [r["ratio_to_torch_sdpa"] for r in rows if "skipped" not in r]
    floor = min(timed, default=1.0) / 2  # where a skipped slot's x sits
    figure, axis = pyplot().subplots(figsize=(13, 5), layout="constrained")
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        of = {r["shape"]: r for r in rows if r["implementation"] == name}
        timed_shapes = [s for s, shape in enumerate(shapes) if shape in of and "skipped" not in of[shape]]
        ratios = [of[shapes[s]]["ratio_to_torch_sdpa"] for s in timed_shapes]
        axis.bar([s + i * width for s in timed_shapes], ratios, width, label=name, color=colour.get(name))
        for s, shape in enumerate(shapes):
            if shape in of and "skipped" in of[shape]:
                axis.bar(s + i * width, floor, width, fill=False, hatch="//", edgecolor=colour.get(name))
                axis.text(s + i * width, floor, "x", ha="center", va="bottom", fontsize=8)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([s + 0.4 - width / 2 for s in range(len(shapes))], shapes)
    axis.set_yscale("log")
    axis.set_ylabel("time / torch SDPA's time (log scale, lower is better)")
    axis.set_title(
        f"causal MultiHeadAttention, {results['dtype']}, {results['machine']['cpus']} CPU cores "
        "(x: skipped, see the table)"
    )
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return figure


def write_chart(results: dict[str, Any], path: str | os.PathLike) -> None:
    """``chart_figure`` as a PNG."""
    save_png(chart_figure(results), path)
