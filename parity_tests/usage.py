"""Bad command-line usage, shared by the ``attn-parity`` commands: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from numpy_attn.files import check_regular_file

__all__ = [
    "MAX_ENTRIES",
    "MAX_SEED",
    "OneLineParser",
    "UsageError",
    "check_folder",
    "check_folder_of",
    "check_sizes",
    "check_writable",
    "console_width",
    "integer",
    "number",
    "png_path",
    "script_parser",
    "writing",
]

MAX_ENTRIES = 2**27  # the largest array a command line may ask for (512 MiB of float32)
MAX_SEED = 2**32 - 1  # seeds are unsigned 32-bit integers (NumPy's legacy seeds, JAX's keys)


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors (``attn-parity trace: error: ...``), exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def script_parser(module: str, doc: str | None) -> OneLineParser:
    """The parser of ``python -m module``: the first paragraph of its docstring ``doc`` says what it
    does; the method is left to ``python -m pydoc module``."""
    summary = (doc or "").strip().split("\n\n")[0]
    return OneLineParser(
        prog=f"python -m {module}", description=summary, epilog=f"how it measures: python -m pydoc {module}"
    )


class UsageError(Exception):
    """Bad usage found after parsing: reported as one line, exit code 2."""


def integer(flag: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type`` for the integer option ``flag``: ``low`` to ``high`` (both included),
    else the one line ``FLAG 'TEXT': expected an integer from LOW to HIGH`` (exit code 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected an integer from {low} to {high}")
        return value

    return parse


def number(flag: str, low: float, high: float, *, low_included: bool = True) -> Callable[[str], float]:
    """An argparse ``type`` for the real option ``flag``: a finite number from ``low`` to ``high``
    (``low`` itself refused unless ``low_included``), else the one line ``FLAG 'TEXT': expected a
    number from LOW to HIGH`` (``above LOW, at most HIGH``) (exit code 2): NaN, an infinity and a
    value that overflows to one (``1e400``) are refused."""
    expected = f"from {low:g} to {high:g}" if low_included else f"above {low:g}, at most {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (low <= value <= high and (low_included or value > low)):  # NaN fails every comparison
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected a number {expected}")
        return value

    return parse


def check_folder(folder: str) -> None:
    """``folder`` must be an existing folder: UsageError naming its absolute path when it does
    not exist or is something else (a file, a FIFO)."""
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{folder} is not a folder")
    if not os.path.isdir(folder):
        raise UsageError(f"the folder {folder} does not exist")


def check_folder_of(path: str) -> None:
    """The folder that is to hold the file ``path`` must exist (``check_folder``)."""
    check_folder(os.path.dirname(os.path.abspath(path)))


def check_writable(path: str) -> None:
    """The file ``path`` must be one this process can write, before any work is done: an
    existing entry must be a regular file (``check_regular_file``: a FIFO would block the writer,
    a device or a folder cannot hold the file) that is writable, and its folder must take a new
    file (probed with an anonymous temporary file: ``os.access`` says yes to root for ``/proc``).
    A link is followed, as the write follows it (``atomic_write`` replaces a link's target, and
    creates a dangling link's target): the folder probed is its target's, which must exist."""
    try:
        check_regular_file(path, missing_ok=True)
    except ValueError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"{path}: {error.strerror}") from None
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(f"{path}: the file is not writable")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.islink(path):
        target = os.path.realpath(path)
        folder = os.path.dirname(target)
        try:
            check_folder(folder)
        except UsageError as error:
            raise UsageError(f"{path} is a link to {target}: {error}") from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise UsageError(f"the folder {folder} cannot hold a new file: {error.strerror}") from None


@contextmanager
def writing(path: str) -> Iterator[None]:
    """Around a command's final write of ``path`` (checked by ``png_path`` before any work): the
    file replaced since by one that is not regular (``save_png``'s ValueError) or a full disk
    (OSError) becomes a UsageError, one line."""
    try:
        yield
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot write {path}: {error}") from None


def png_path(path: str, name: str) -> str:
    """The PNG file that ``path`` names: ``name`` inside it when it is an existing folder, with
    ``.png`` added when it has no extension (as matplotlib adds it); UsageError for an empty
    path or file name, a file name that is only the extension (``.png``, which matplotlib would
    write as ``.png.png``), another extension, a folder that does not exist or a file that cannot
    be written (``check_writable``)."""
    if os.path.isdir(path):
        path = os.path.join(path, name)
    if os.path.basename(path).lower() in ("", ".png"):
        raise UsageError(
            f"{path!r}: no file name: expected a .png file, a name without extension or a folder"
        )
    extension = os.path.splitext(path)[1]
    if not extension:
        path += ".png"
    elif extension.lower() != ".png":
        raise UsageError(f"{path}: expected a .png file, a name without extension or a folder")
    check_folder_of(path)
    check_writable(path)
    return path


def check_sizes(flag: str, text: str, sizes: Sequence[int], arrays: Sequence[Sequence[int]]) -> None:
    """ValueError unless every one of ``sizes`` (read from ``flag text``) is at least 1 and each
    array they make (of the shapes ``arrays``) holds at most ``MAX_ENTRIES`` entries."""
    if min(sizes) < 1:
        raise ValueError(f"{flag} {text!r}: every size must be at least 1")
    for shape in arrays:
        if math.prod(shape) > MAX_ENTRIES:
            raise ValueError(
                f"{flag} {text!r}: an array of shape {tuple(shape)} would hold {math.prod(shape)} "
                f"entries, more than the {MAX_ENTRIES} a command line may ask for"
            )


console_width = integer("--width", 40, 1000)  # the --width of the commands printing tables
