"""Atomic writes: a file (or directory) appears under its final name complete, or not at all.

The content goes to a temp name next to the target (``.<name>.XXXX.tmp``, same file system), is
fsynced, given its final mode and renamed over the target; on any failure the temp is removed and
the target is left as it was. ``mkstemp``/``mkdtemp`` create 0o600/0o700 entries, so the final mode
is set explicitly: by default 0o666/0o777 minus the process umask, as ``open()``/``mkdir()`` would.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


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
def atomic_path(path: str | os.PathLike, *, mode: int | None = None) -> Iterator[Path]:
    """Yield an empty temp file next to ``path``; when the block succeeds, fsync it, chmod it to
    ``mode`` (default ``file_mode()``) and rename it over ``path``; when it fails, remove it."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
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


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temp directory next to ``path`` (which must not exist); when the block succeeds,
    chmod it to ``dir_mode()`` and rename it to ``path``; when it fails, remove it with its content."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, dir_mode())
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


__all__ = ["atomic_dir", "atomic_open", "atomic_path", "dir_mode", "file_mode", "write_json_atomic",
           "write_text_atomic"]
