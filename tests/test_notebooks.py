"""The notebooks of ``notebooks/`` run top to bottom in a kernel of this Python (the project's .venv),
from the repository's root, and show what the notes, the book and its bonus notebooks print: they
cannot go stale.

The outputs are not committed: this run makes them and reads them.
"""

import pathlib
import re

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def run(path: pathlib.Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), (
        "outputs committed"
    )
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    return notebook


def text_of(notebook: nbformat.NotebookNode) -> str:
    """The text the cells printed, without the colours' escape codes."""
    text = "\n".join(
        output.get("text", "") + output.get("data", {}).get("text/plain", "")
        for cell in notebook.cells
        for output in cell.get("outputs", [])
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.subprocess
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_the_notebook_runs_and_prints_the_notes_numbers_with_pictures(path):
    notebook = run(path)
    text = text_of(notebook)
    assert "✗" not in text and "Traceback" not in text
    sections = [
        c.source.splitlines()[0]
        for c in notebook.cells
        if c.cell_type == "markdown" and c.source.startswith("## ")
    ]
    assert sections == sorted(sections)  # the book's section order
    images = sum("image/png" in o.get("data", {}) for c in notebook.cells for o in c.get("outputs", []))
    if path.stem.startswith("chapter_3"):
        assert sections[0].startswith("## 3.3.1") and sections[-1].startswith("## 3.6.2")
        assert "the notes print [0.4306, 1.4551] ✓" in text
        assert "the notes print this 2x6x2 table ✓" in text  # MultiHeadAttention's [0.3190, 0.4858] rows
        assert images >= 3  # the weights, the causal weights, the heads' heatmap
    elif path.stem.startswith("chapter_4"):
        assert sections[0].startswith("## 4.1") and sections[-1].startswith("## 4.7")
        assert "the book prints [[15496, 11, 314, 716, 27018, 24086, 47843, 30961, 42348, 7267]] ✓" in text
        assert images >= 2  # GELU against ReLU, the layers x heads grid
    else:  # the book's Llama 3 / Qwen3 bonus notebooks: RoPE, RMSNorm, GQA, QK-norm
        assert sections[0].startswith("## 1. RoPE") and sections[-1].startswith("## 6. QK-norm")
        assert "the book's notebook prints [[1024, 4096], [1024, 4096], [4096, 4096]] ✓" in text
        assert "the book's notebook prints 41943040 ✓" in text and "the notes print" not in text
        assert "by hand equals numpy_attn.rope: True" in text and "repeat gives the same order: False" in text
        assert images >= 2  # the score against the distance, Llama 3's scaling against the wavelength


def test_every_notebook_is_tested():
    assert [p.name for p in NOTEBOOKS] == [
        "chapter_3_attention.ipynb",
        "chapter_4_gpt.ipynb",
        "chapter_modern_decoders.ipynb",
    ]
