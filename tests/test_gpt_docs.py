"""docs/gpt.md's examples run as written, in order, in one namespace (they build on each other)."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "gpt.md"


def test_the_build_a_model_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    assert namespace["report"].ok
    assert namespace["greedy"].shape == (1, 10)
