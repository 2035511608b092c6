"""The README's and the guides' examples run as written (the documentation must always be true).

A README section's blocks run in order in one namespace (a section's examples build on each
other), as do a guide's."""

import pathlib
import re

import pytest

from numpy_attn.spec import SPECS

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def readme_sections() -> dict[str, str]:
    """``## `` heading -> that section's text, for the sections that hold Python examples."""
    parts = re.split(r"^## ", README.read_text(), flags=re.M)[1:]
    return {part.splitlines()[0]: part for part in parts if python_blocks(part)}


def run_in_order(blocks: list[str], filename: str) -> None:
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, filename, "exec"), namespace)


@pytest.mark.parametrize("section", list(readme_sections()))
def test_readme_section_examples_run(section):
    run_in_order(python_blocks(readme_sections()[section]), str(README))


@pytest.mark.parametrize("guide", GUIDES, ids=[guide.name for guide in GUIDES])
def test_guide_examples_run(guide):
    blocks = python_blocks(guide.read_text())
    assert blocks, f"{guide.name} has no example"
    run_in_order(blocks, str(guide))


def test_readme_links_every_guide():
    text = README.read_text()
    for guide in GUIDES:
        assert f"(docs/{guide.name})" in text


def test_readme_shows_install_and_the_two_commands_before_the_tour():
    text = README.read_text()
    assert text.index('pip install "attn-parity[all]"') < text.index("make report") < text.index("make test")
    assert text.index("make test") < text.index("## Five-minute tour") < text.index("## Architecture")


def test_readme_names_every_layer():
    text = README.read_text()
    for spec in SPECS.values():
        assert f"`{spec.name}(" in text and f"`{spec.function}`" in text
