"""The README's examples run as written (the README must always be true)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(block):
    exec(compile(block, str(README), "exec"), {})


def test_readme_shows_the_two_commands_first():
    text = README.read_text()
    assert text.index("make report") < text.index("make test") < text.index("## The classes")
