"""The README's and the guides' examples run as written: the documentation must always be true.

Every ```python block runs on its own, in a fresh process in an empty folder, as a reader would
paste it into ``python -c`` (forked by tests/example_server.py from a process that has imported
the heavy packages and computed nothing: each example is spared their ~3 s import); a block
whose first line is ``# continues the block above`` runs after the blocks before it in its file,
in the same process (one test per chain). A ```text block right after a block is what that block
prints: the test compares it line by line (trailing spaces ignored; the folder it ran in and the
checkout's shown as ``...``)."""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from numpy_attn.spec import SPECS

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
CONTINUES = "# continues the block above"
SEPARATOR = "--- the block above ends here ---"  # printed between chained blocks: each shows its own output
BLOCK = re.compile(r"```python\n(.*?)```(?:\n+```text\n(.*?)```)?", flags=re.S)


def examples(path: pathlib.Path) -> list[tuple[str, list[str], list[str | None]]]:
    """``(id, codes, shown outputs)`` of each runnable example of ``path``: a block and the blocks
    that continue it, run in one process."""
    found: list[tuple[str, list[str], list[str | None]]] = []
    for number, match in enumerate(BLOCK.finditer(path.read_text()), start=1):
        code, shown = match.group(1), match.group(2)
        if code.startswith(CONTINUES) and found:
            name, codes, outputs = found[-1]
            found[-1] = (f"{name.split('..')[0]}..{number}", [*codes, code], [*outputs, shown])
        else:
            found.append((f"{path.name}#{number}", [code], [shown]))
    return found


EXAMPLES = [example for path in (README, *GUIDES) for example in examples(path)]


@pytest.fixture(scope="module")
def python_c(tmp_path_factory):
    """``python_c(code, folder)``: ``(returncode, stdout, stderr)`` of ``python -c code`` run in
    ``folder`` with the checkout on PYTHONPATH, each call in a process forked by the server."""
    server = subprocess.Popen(
        [sys.executable, "-c", (ROOT / "tests" / "example_server.py").read_text()],
        cwd=tmp_path_factory.mktemp("server"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={"PYTHONPATH": str(ROOT), **_environment()},
    )  # fmt: skip
    outputs = tmp_path_factory.mktemp("outputs")

    def python_c(code: str, folder: pathlib.Path) -> tuple[int, str, str]:
        stdout, stderr = outputs / "stdout", outputs / "stderr"
        request = {"code": code, "cwd": str(folder), "stdout": str(stdout), "stderr": str(stderr)}
        request["timeout"] = 300
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        answer = server.stdout.readline()
        assert answer, f"the example server ended (status {server.wait()})"
        return json.loads(answer)["returncode"], stdout.read_text(), stderr.read_text()

    yield python_c
    server.stdin.close()
    server.wait(timeout=60)


@pytest.mark.parametrize("codes, shown", [e[1:] for e in EXAMPLES], ids=[e[0] for e in EXAMPLES])
def test_every_example_runs_alone_and_prints_what_is_shown(codes, shown, tmp_path, python_c):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # what a clone's folder holds
    returncode, stdout, stderr = python_c(f"\nprint({SEPARATOR!r})\n".join(codes), tmp_path)
    assert returncode == 0, stderr[-3000:]
    printed = stdout.replace(str(tmp_path), "...").replace(str(ROOT), "...").split(f"{SEPARATOR}\n")
    assert len(printed) == len(codes)
    for number, (output, expected) in enumerate(zip(printed, shown, strict=True)):
        if expected is not None:  # a block with no output shown may print anything
            lines = [line.rstrip() for line in output.splitlines()]
            assert lines == [line.rstrip() for line in expected.splitlines()], (
                f"block {number + 1} of the chain"
            )


def _environment() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def test_every_guide_has_an_example_and_the_readme_links_it():
    text = README.read_text()
    for guide in GUIDES:
        assert examples(guide), f"{guide.name} has no example"
        assert f"(docs/{guide.name})" in text


def test_the_readme_opens_with_install_and_the_two_commands_before_the_quickstart():
    text = README.read_text()
    assert text.index('pip install ".[all]"') < text.index("make report") < text.index("make test")
    assert text.index("make test") < text.index("## Quickstart") < text.index("## Architecture")


def test_the_readme_names_every_layer():
    text = README.read_text()
    for spec in SPECS.values():
        assert f"`{spec.name}(" in text and f"`{spec.function}`" in text
