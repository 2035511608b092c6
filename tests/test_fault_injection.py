"""Faults injected into every save function: a process killed (kill -9) at random points, a full disk
(RLIMIT_FSIZE), two writers at once, readers during saves. After each, the path holds the old or
the new complete content: it loads, and equals one of them (docs/hardening.md, "Saving").

Each fault happens in a child forked from a fresh server process that has imported this module (a
child costs milliseconds, and forks no JAX threads: the test process may hold them), at seeded
random times; the file runs in a few seconds."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import resource
import signal
import time

import numpy as np
import pytest

import numpy_attn
from parity_tests.bench.output import write_json

CONFIG = {"vocab_size": 256, "context_length": 32, "emb_dim": 32, "n_heads": 2, "n_layers": 2}
CONFIG |= {"drop_rate": 0.0, "qkv_bias": True}
KILLS = 4  # random points per save function
FILE_LIMIT = 4096  # bytes a process on a "full disk" may write to a file: config.json fits, weights do not


def params(seed: int) -> dict[str, np.ndarray]:
    """A GPT's weights (about 200 kB), drawn under ``seed``."""
    rng = np.random.default_rng(seed)
    shapes = numpy_attn.gpt_param_shapes(CONFIG)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


# each save function: how it writes ``content`` (a params dict) to ``path`` and reads it back
SAVES = {
    "safetensors": (numpy_attn.save_weights, numpy_attn.load_weights),
    "npz": (numpy_attn.save_weights, numpy_attn.load_weights),
    "gpt2_folder": (
        lambda path, content: numpy_attn.save_hf_gpt2(path, content, CONFIG),
        lambda path: numpy_attn.load_hf_gpt2(path)[0],
    ),
    "bench_json": (  # the CLI's files (PNG, JSON, README) are written as the weights are (atomic_write)
        lambda path, content: write_json({"tok_emb.weight": content["tok_emb.weight"][:8].tolist()}, path),
        lambda path: {"tok_emb.weight": np.float32(json.loads(path.read_text())["tok_emb.weight"])},
    ),
}
WEIGHTS = ["safetensors", "npz", "gpt2_folder"]


def target(tmp_path, kind: str):
    return tmp_path / {"safetensors": "w.safetensors", "npz": "w.npz", "gpt2_folder": "gpt2"}.get(
        kind, "b.json"
    )


def save(kind: str, path, content) -> None:
    SAVES[kind][0](path, content)


def assert_one_of(kind: str, path, *contents) -> None:
    """``path`` loads (no exception) and holds exactly one of ``contents``."""
    actual = SAVES[kind][1](path)
    if kind == "bench_json":  # which holds the first rows of one array
        contents = tuple({"tok_emb.weight": content["tok_emb.weight"][:8]} for content in contents)
    assert all(list(actual) == list(content) for content in contents)
    assert any(all(np.array_equal(actual[k], content[k]) for k in actual) for content in contents), path


def entries(path) -> list[str]:
    """What lies beside a file, or in a folder: the temporaries a failed save must not leave."""
    folder = path if path.is_dir() else path.parent
    return sorted(os.listdir(folder))


SERVER = multiprocessing.get_context("forkserver")
SERVER.set_forkserver_preload([__name__])


def _saves(pipe, kind: str, path, contents: tuple, rounds: int | None, file_limit: int | None) -> None:
    """The child: ``save`` each of ``contents`` in turn, ``rounds`` times in all (None: until killed),
    on a disk that takes ``file_limit`` bytes a file; sends ``""``, or ``"Type: message"`` of its
    exception and exits with 1."""
    try:
        if file_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
        for content in itertools.islice(itertools.cycle(contents), rounds):
            save(kind, path, content)
    except BaseException as error:
        pipe.send(f"{type(error).__name__}: {error}")
        raise SystemExit(1) from None
    pipe.send("")


def spawn(kind: str, path, *contents, rounds: int | None = None, file_limit: int | None = None):
    """A child process saving ``contents`` (``_saves``), and the end of its pipe."""
    read, write = SERVER.Pipe(duplex=False)
    child = SERVER.Process(target=_saves, args=(write, kind, path, contents, rounds, file_limit))
    child.start()
    write.close()
    return child, read


def finished(child, read) -> tuple[int, str]:
    """The child's exit code (negative: killed by that signal) and what it sent."""
    child.join()
    try:
        message = read.recv()
    except EOFError:  # killed before it could send
        message = ""
    return child.exitcode, message


@pytest.mark.parametrize("kind", [*SAVES, "gpt2_over_plain_files"])
def test_a_save_killed_at_random_points_leaves_the_old_or_the_new_content(tmp_path, kind):
    """A child saves the new and the old content in turn until it is killed, at a seeded random time
    within its first two saves; ``gpt2_over_plain_files`` starts from a folder of plain files, as
    transformers writes it, so that the kill also lands in the first save's change of layout. A later
    save leaves one version and no temporary."""
    over_plain = kind == "gpt2_over_plain_files"
    kind = "gpt2_folder" if over_plain else kind
    old, new = params(0), params(1)
    rng = np.random.default_rng(7)
    timed = target(tmp_path / "timed", kind)
    timed.parent.mkdir()
    start = time.perf_counter()
    for content in (new, old, new, old):
        save(kind, timed, content)
    window = (time.perf_counter() - start) / 2  # two saves
    for trial in range(KILLS):
        path = target(tmp_path / str(trial), kind)
        path.parent.mkdir()
        save(kind, path, old)
        if over_plain:  # the files themselves in place of the links
            for name in ("config.json", "model.safetensors"):
                data = (path / name).read_bytes()
                (path / name).unlink()
                (path / name).write_bytes(data)
        child, read = spawn(kind, path, new, old)
        time.sleep(rng.uniform(0, window))
        os.kill(child.pid, signal.SIGKILL)
        assert finished(child, read)[0] == -signal.SIGKILL
        assert_one_of(kind, path, old, new)
    save(kind, path, new)
    assert_one_of(kind, path, new)
    if kind == "gpt2_folder":
        assert [name for name in entries(path) if name.startswith(".")][:1] == [".current"]
        assert len([name for name in entries(path) if name.startswith(".version-")]) == 1
        assert not [name for name in entries(path) if name.endswith(".tmp")]


@pytest.mark.parametrize("kind", list(SAVES))
def test_a_full_disk_leaves_the_old_content_no_temporary_and_one_clear_error(tmp_path, kind):
    """The child may write at most ``FILE_LIMIT`` bytes to a file (RLIMIT_FSIZE: the write fails with
    EFBIG, as on a full disk, ENOSPC): the save raises one OSError naming the path, which still
    holds the old content, beside no temporary."""
    old, new = params(0), {name: value + 1 for name, value in params(0).items()}
    path = target(tmp_path, kind)
    save(kind, path, old)
    before = entries(path)
    code, message = finished(*spawn(kind, path, new, rounds=1, file_limit=FILE_LIMIT))
    assert (code, message) == (1, f"OSError: [Errno 27] File too large: '{path}'")
    assert_one_of(kind, path, old)
    assert entries(path) == before


@pytest.mark.parametrize("kind", WEIGHTS)
def test_two_writers_at_once_leave_one_complete_result(tmp_path, kind):
    first, second = params(1), params(2)
    path = target(tmp_path, kind)
    save(kind, path, params(0))
    writers = [spawn(kind, path, content, rounds=3) for content in (first, second)]
    assert [finished(*writer) for writer in writers] == [(0, ""), (0, "")]
    assert_one_of(kind, path, first, second)
    expected = [".current", "config.json", "model.safetensors"] if kind == "gpt2_folder" else [path.name]
    assert [name for name in entries(path) if not name.startswith(".version-")] == expected


@pytest.mark.parametrize("kind", WEIGHTS)
def test_readers_during_saves_see_the_old_or_the_new_content(tmp_path, kind):
    """The test reads while a child saves the new and the old content in turn, eight times."""
    old, new = params(0), params(1)
    path = target(tmp_path, kind)
    save(kind, path, old)
    child, read = spawn(kind, path, new, old, rounds=8)
    reads = 0
    while True:
        done = not child.is_alive()
        assert_one_of(kind, path, old, new)
        reads += 1
        if done:
            break
    assert finished(child, read) == (0, "") and reads > 1
