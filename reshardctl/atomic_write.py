"""Atomic writes: a file (or directory) appears under its final name complete, or not at all.

A symlink is written through: the file it points to is replaced and the link stays (``through_link``).
Only regular files are replaced: an existing directory, device, FIFO or socket is refused
(``output_problem``; commands check it first to name their flag, the writes check it again).
The content goes to a temp name next to the target (``.<name>.XXXX.tmp``, same file system), is
fsynced, given its final mode and renamed over the target; on any failure the temp is removed and
the target is left as it was. ``mkstemp``/``mkdtemp`` create 0o600/0o700 entries, so the final mode
is set explicitly: by default 0o666/0o777 minus the process umask, as ``open()``/``mkdir()`` would.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def through_link(path: str | os.PathLike) -> Path:
    """Where a write to ``path`` lands: a symlink is written through (its target is replaced, the link
    stays a link), so a write never silently turns a link into a plain file."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def output_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be an output file, or None: every output is a regular file, so an existing
    directory, device, FIFO or socket (or a symlink to one) is refused, never replaced (``--write
    /dev/null`` must not put a plain file where the device was)."""
    try:
        st = os.stat(path)  # symlinks followed: the write goes through them
    except OSError:
        return None  # missing (created), or a problem the write itself reports
    if stat.S_ISDIR(st.st_mode):
        return "is a directory; give a file name"
    if not stat.S_ISREG(st.st_mode):
        return "exists and is not a regular file (a device, FIFO or socket is never replaced)"
    return None


def _refuse_special(path: Path) -> None:
    why = output_problem(path)
    if why is not None:
        raise OSError(errno.EINVAL, why, str(path))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """0o666 minus the process umask (``mkstemp`` creates 0o600 files)."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """0o777 minus the process umask (``mkdtemp`` creates 0o700 directories)."""
    return 0o777 & ~_umask()


@contextmanager
def _naming(path: Path, tmp: Path | None = None) -> Iterator[None]:
    """An ``OSError`` raised while writing ``path`` names ``path`` (a full disk's ``write`` names no file,
    a failed temp file names only its temp name): ``[Errno 28] No space left on device: 'run/summary.json'``."""
    try:
        yield
    except OSError as exc:
        if exc.filename in (None, str(tmp)) or (tmp is None and exc.filename != str(path)):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike, *, mode: int | None = None) -> Iterator[Path]:
    """Yield an empty temp file next to ``path``; when the block succeeds, fsync it, chmod it to
    ``mode`` (default ``file_mode()``) and rename it over ``path``; when it fails, remove it."""
    path = through_link(path)
    _refuse_special(path)
    with _naming(path):
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        with _naming(path, tmp):
            yield tmp
            _fsync(tmp)
            os.chmod(tmp, file_mode() if mode is None else mode)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_open(path: str | os.PathLike, *, binary: bool = False, mode: int | None = None) -> Iterator[IO]:
    """``atomic_path`` with the temp file opened for writing (text, or bytes with ``binary``)."""
    with atomic_path(path, mode=mode) as tmp, open(tmp, "wb" if binary else "w") as f:
        yield f


def write_text_atomic(path: str | os.PathLike, text: str, *, mode: int | None = None) -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path``."""
    with atomic_open(path, mode=mode) as f:
        f.write(text)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, data: Any, *, mode: int | None = None, **dumps: Any) -> Path:
    """``json.dumps(data, **dumps)`` plus a newline, written atomically; returns ``path``."""
    return write_text_atomic(path, json.dumps(data, **dumps) + "\n", mode=mode)


class StagedWrites:
    """Several outputs that appear together or not at all. ``file(path)`` / ``dir(path)`` return a temp
    file / an empty temp directory next to ``path``; fill them, then ``commit()`` renames every one over
    its target (files fsynced and given ``mode``, default ``file_mode()``, directories ``mode``, default
    ``dir_mode()``), while ``abort()`` removes them all. As a context manager: commit when the block
    succeeds, abort when it raises. Nothing is renamed before every output has been written."""

    def __init__(self) -> None:
        self._entries: list[tuple[Path, Path, bool, int | None]] = []  # (temp, target, is_dir, mode)

    def file(self, path: str | os.PathLike, *, mode: int | None = None) -> Path:
        path = through_link(path)
        _refuse_special(path)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        self._entries.append((Path(name), path, False, mode))
        return Path(name)

    def dir(self, path: str | os.PathLike, *, mode: int | None = None) -> Path:
        path = Path(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        self._entries.append((tmp, path, True, mode))
        return tmp

    def commit(self) -> list[Path]:
        for tmp, _, is_dir, mode in self._entries:  # everything that can fail before the first rename
            if is_dir:
                os.chmod(tmp, dir_mode() if mode is None else mode)
            else:
                _fsync(tmp)
                os.chmod(tmp, file_mode() if mode is None else mode)
        for tmp, target, is_dir, _ in self._entries:
            (os.rename if is_dir else os.replace)(tmp, target)
        done = [target for _, target, _, _ in self._entries]
        self._entries = []
        return done

    def abort(self) -> None:
        for tmp, _, is_dir, _ in self._entries:
            if is_dir:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
        self._entries = []

    def __enter__(self) -> "StagedWrites":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()


__all__ = ["StagedWrites", "output_problem", "through_link", "atomic_open", "atomic_path", "dir_mode", "file_mode", "write_json_atomic",
           "write_text_atomic"]
