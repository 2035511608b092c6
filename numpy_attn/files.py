"""The files numpy_attn reads and writes: regular files only, and every write atomic.

``open_regular_file`` opens only a regular file (a FIFO, a device, a directory or a link to one is
refused before opening, so that nothing blocks). ``atomic_write`` writes a new file beside the
target and renames it over the target once it is complete and on disk: a reader, a crash or a
full disk finds the old complete file or the new complete one, never a mix or a truncated file.

``write_folder`` does the same for a set of files in a folder (a checkpoint's): each set is written
to a new hidden folder, ``.version-<token>``, and the folder switches to it with one atomic rename of
a link, ``.current``; the files themselves are links through it (``config.json ->
.current/config.json``), so that any program opening them by name reads the current set.
``read_folder`` reads one set, the one the link names when it starts.

An ``OSError`` from a user's path names that path, in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeVar

_POINTER, _VERSION = ".current", ".version-"  # the link naming a folder's files, their folders' prefix
T = TypeVar("T")


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
    try:
        with _beside(target, "tmp") as temporary:
            mode = os.stat(target).st_mode if os.path.exists(target) else None
            with open(temporary, "xb") as file:
                mode = os.fstat(file.fileno()).st_mode if mode is None else mode  # a new file's
                yield file
            descriptor = os.open(temporary, os.O_RDONLY)  # the file now at that name
            try:
                os.fchmod(descriptor, stat.S_IMODE(mode))
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
    except OSError as error:
        raise named_error(error, path) from None


@contextlib.contextmanager
def _beside(path: str, kind: str) -> Iterator[str]:
    """A new name in ``path``'s folder (``.<name>.<16 hex>.<kind>``) for the block to fill, renamed
    over ``path`` once the block ends, then the folder flushed to disk; on any error the new name is
    removed and ``path`` holds what it held."""
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name.lstrip('.')}.{secrets.token_hex(8)}.{kind}")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    fsync_folder(folder)


def write_folder(directory: str, names: tuple[str, ...], write: Callable[[str], None]) -> None:
    """Replace the files ``names`` of the folder ``directory`` (which exists) by those ``write(version)``
    writes in the new folder ``version``, all at once: a reader, a crash or a full disk finds the old
    complete set or the new one, never a mix. Writes to one folder run one at a time (a lock on it,
    released when the process ends, however it ends).

    The set is flushed to disk, then the folder is switched to it (module docstring). The folder's
    own files where they are not yet links (another program's) are first moved into a version of
    their own, unchanged at each step. On any error the folder holds the set it held and no
    temporary; a process killed meanwhile may leave a hidden version folder, which the next write
    removes. ValueError, before anything is written, where one of ``names`` is not a regular file;
    an OSError names ``directory``."""
    for name in names:
        check_regular_file(os.path.join(directory, name), missing_ok=True)
    try:
        with _locked(directory):
            try:
                version = _new_version(directory)
                write(version)
                fsync_folder(version)
                _adopt(directory, names)
                _link(os.path.join(directory, _POINTER), os.path.basename(version))  # the switch
            finally:
                _remove_unused(directory, names)
    except OSError as error:
        raise named_error(error, directory) from None


def read_folder(directory: str, names: tuple[str, ...], read: Callable[[dict[str, str]], T]) -> T:
    """``read(paths)``: ``paths`` the files ``names`` of one set of ``directory`` (``write_folder``),
    the link that names it read once; where a write removed that set meanwhile, the new one."""
    paths = _pinned(directory, names)
    for _ in range(8):
        try:
            return read(paths)
        except FileNotFoundError:
            if _pinned(directory, names) == paths:
                raise
            paths = _pinned(directory, names)
    return read(paths)


def _ours(directory: str, name: str) -> bool:
    """Whether the folder's entry ``name`` is the link through the pointer that ``write_folder`` makes."""
    path = os.path.join(directory, name)
    return os.path.islink(path) and os.readlink(path) == os.path.join(_POINTER, name)


def _pinned(directory: str, names: tuple[str, ...]) -> dict[str, str]:
    """The paths of the folder's files, those behind the pointer read once: one version."""
    pointer = os.path.join(directory, _POINTER)
    version = os.path.join(directory, os.readlink(pointer)) if os.path.islink(pointer) else None
    return {
        name: os.path.join(version if version and _ours(directory, name) else directory, name)
        for name in names
    }


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _new_version(directory: str) -> str:
    version = os.path.join(directory, f"{_VERSION}{secrets.token_hex(8)}")
    os.mkdir(version)
    return version


def _link(path: str, target: str) -> None:
    """``path`` made a link to ``target`` with one atomic rename, then flushed to disk."""
    with _beside(path, "link") as temporary:
        os.symlink(target, temporary)


def _adopt(directory: str, names: tuple[str, ...]) -> None:
    """The folder's entries ``names`` made links through the pointer, what they hold unchanged at
    each step: a file there first becomes the pointed version's (a hard link, or a copy), in a new
    version where there is no pointer yet."""
    if all(_ours(directory, name) for name in names):
        return
    pointer = os.path.join(directory, _POINTER)
    if not os.path.islink(pointer):
        _link(pointer, os.path.basename(_new_version(directory)))
    current = os.path.join(directory, os.readlink(pointer))
    for name in names:
        path = os.path.join(directory, name)
        if _ours(directory, name):
            continue
        if os.path.exists(path):
            with _beside(os.path.join(current, name), "tmp") as copy:
                try:
                    os.link(os.path.realpath(path), copy)
                except OSError:  # another file system, or one without links
                    shutil.copyfile(path, copy)
        _link(path, os.path.join(_POINTER, name))


def _remove_unused(directory: str, names: tuple[str, ...]) -> None:
    """The versions the pointer does not name, and the links of this write or of killed ones not yet
    renamed into place (the lock is held: no other write runs)."""
    pointer = os.path.join(directory, _POINTER)
    current = os.readlink(pointer) if os.path.islink(pointer) else None
    links = re.compile(rf"\.({'|'.join(map(re.escape, (_POINTER[1:], *names)))})\.[0-9a-f]{{16}}\.link")
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if entry.startswith(_VERSION) and entry != current and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif links.fullmatch(entry):
            with contextlib.suppress(OSError):
                os.remove(path)
