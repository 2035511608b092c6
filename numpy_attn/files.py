"""The files numpy_attn reads and writes: regular files only, and every write atomic.

``open_regular_file`` opens only a regular file (a FIFO, a device, a directory or a link to one is
refused before opening, so that nothing blocks). ``atomic_write`` writes a new file beside the
target and renames it over the target once it is complete and on disk: a reader, a crash or a
full disk finds the old complete file or the new complete one, never a mix or a truncated file.
An ``OSError`` from a user's path names that path, in one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["atomic_write", "check_regular_file", "fsync_folder", "named_error", "open_regular_file"]


def named_error(error: OSError, path: str | os.PathLike) -> OSError:
    """``error`` as the same kind of OSError naming ``path`` (not a temporary name): one line."""
    return OSError(error.errno, error.strerror or str(error), os.fspath(path))


def check_regular_file(path: str | os.PathLike, *, missing_ok: bool = False) -> None:
    """ValueError unless ``path`` is a regular file (links followed: a link to a FIFO is a FIFO),
    before anything opens it; FileNotFoundError where nothing is there, unless ``missing_ok``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"{os.fspath(path)} is not a regular file (a FIFO, device, directory or a link to one)"
        )


def open_regular_file(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading (binary) if it is a regular file (``check_regular_file``), opened
    without blocking and checked again on the open descriptor (the path may change in between)."""
    check_regular_file(path)
    file = os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb")
    if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
        file.close()
        raise ValueError(f"{os.fspath(path)} is not a regular file (it was replaced while being opened)")
    return file


def fsync_folder(folder: str | os.PathLike) -> None:
    """Flush ``folder``'s entries (a rename in it) to disk, where the file system allows it."""
    descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(descriptor)
    except OSError as error:  # some file systems cannot sync a folder; the rename is still atomic
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Replace the file ``path`` with what the block writes to the yielded file, atomically.

    The block writes a new file in the target's folder (to the yielded file object, or by its
    ``name``: a library may write that name, even by replacing it); once the block ends, that file
    gets the target's permissions (a new target: the usual ones for a new file), is flushed to disk
    (``fsync``), renamed over the target (``os.replace``) and the folder is flushed. A link is
    followed: its target is what is replaced, and the link stays a link. On any error, or an
    exception from the block, the target keeps its old content and the new file is removed.

    Raises ValueError, before anything is written, when the target exists and is not a regular
    file; an OSError (a missing folder, a full disk) names ``path``.
    """
    target = os.path.realpath(path)
    check_regular_file(target, missing_ok=True)
    folder, name = os.path.split(target)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    try:
        file = open(temporary, "xb")  # closed after the block
        mode = os.stat(target).st_mode if os.path.exists(target) else os.fstat(file.fileno()).st_mode
    except OSError as error:
        raise named_error(error, path) from None
    try:
        with file:
            yield file
        descriptor = os.open(temporary, os.O_RDONLY)  # the file now at that name
        try:
            os.fchmod(descriptor, stat.S_IMODE(mode))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, target)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(error, OSError):
            raise named_error(error, path) from None
        raise
    fsync_folder(folder)
