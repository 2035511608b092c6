"""The benchmark's outputs: JSON on disk, a PNG chart, and the README table made from the JSON."""

from __future__ import annotations

import json
import os
from typing import Any

from parity_tests.png import pyplot, save_png

__all__ = ["format_time", "markdown_table", "update_readme", "write_chart", "write_json"]

README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


def write_json(results: dict[str, Any], path: str | os.PathLike) -> None:
    with open(path, "w") as file:
        json.dump(results, file, indent=2)


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
        ratio = "" if row["ratio_to_torch_sdpa"] is None else f"{row['ratio_to_torch_sdpa']:.2f}x"
        memory = row.get("extra_memory_bytes")
        memory = "" if memory is None else f"{memory / 2**30:.2f} GiB"
        lines.append(
            f"| {row['shape']} | {row['implementation']} | {format_time(row['median_s'])} | "
            f"{row['gflops']:.1f} | {row['pct_of_gemm_peak']:.0f} % | {ratio} | {memory} |"
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


def update_readme(results: dict[str, Any], path: str | os.PathLike) -> None:
    """Replace the README's table between the bench markers with one made from ``results``."""
    with open(path) as file:
        text = file.read()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    with open(path, "w") as file:
        file.write(text[:start] + "\n" + markdown_table(results) + "\n" + text[end:])


def write_chart(results: dict[str, Any], path: str | os.PathLike) -> None:
    """Time relative to torch SDPA per shape and implementation (lower is faster), as a PNG."""
    rows = [r for r in results["results"] if r.get("ratio_to_torch_sdpa") is not None]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    names = list(dict.fromkeys(r["implementation"] for r in rows))
    figure, axis = pyplot().subplots(figsize=(12, 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ratios = {r["shape"]: r["ratio_to_torch_sdpa"] for r in rows if r["implementation"] == name}
        positions = [s + i * width for s, shape in enumerate(shapes) if shape in ratios]
        axis.bar(positions, [ratios[shape] for shape in shapes if shape in ratios], width, label=name)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([s + 0.4 - width / 2 for s in range(len(shapes))], shapes)
    axis.set_yscale("log")
    axis.set_ylabel("time / torch SDPA's time (log)")
    axis.set_title(f"causal MultiHeadAttention, {results['dtype']}, {results['machine']['cpus']} CPU cores")
    axis.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    save_png(figure, path)
