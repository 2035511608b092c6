"""The README's examples run as written (the README must always be true)."""

import pathlib
import re

import pytest

from numpy_attn.spec import SPECS

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(block):
    exec(compile(block, str(README), "exec"), {})


def test_readme_shows_install_and_the_two_commands_before_the_tour():
    text = README.read_text()
    assert text.index('pip install "attn-parity[all]"') < text.index("make report") < text.index("make test")
    assert text.index("make test") < text.index("## Five-minute tour") < text.index("## Architecture")


def test_readme_names_every_layer():
    text = README.read_text()
    for spec in SPECS.values():
        assert f"`{spec.name}(" in text and f"`{spec.function}`" in text
