"""Read a file a rank loads from a run directory (a session file, a plan file it unpickles; a calibration
rank's spec, which says where it writes): only when this rank's user owns it and its
directory, and nobody else can write either.

A pickle runs code when it is loaded, so a session file another user could write or replace is that
user's code running as this rank's user. The checks are made on what was opened, not on a path looked
up twice: the directory is opened first and ``fstat``-ed, the file is opened inside that very directory
(``dir_fd``, no symlink followed) and ``fstat``-ed, then read from the same descriptor. There is no
window between the check and the read in which either can be swapped.
"""

from __future__ import annotations

import os
import stat

from reshardctl.errors import InputError


class UntrustedFileError(InputError):
    """A file a rank would unpickle is not the rank's user's alone (exit 2: nothing was loaded)."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def not_private(st: os.stat_result) -> str | None:
    """Why a file or directory with this ``stat`` is not this process's user's alone (owned by another
    user, or writable by group or others), else None."""
    me = os.geteuid()
    if st.st_uid != me:
        return f"is owned by {_owner(st.st_uid)}, not by this process's user ({_owner(me)})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _check(st: os.stat_result, what: str) -> None:
    why = not_private(st)
    if why:
        raise UntrustedFileError(f"{what} {why}: refused, nothing loaded (a pickle runs code when it is loaded; "
                                 f"another user could have replaced it)")


def read_trusted(path: str | os.PathLike, kind: str = "session file", max_bytes: int | None = None) -> bytes:
    """The bytes of ``path`` when it is a regular file owned by this process's user, not writable by
    group or others, in a directory that is the same; else ``UntrustedFileError`` naming the path.
    ``OSError`` when it cannot be opened or read; ``max_bytes``: at most that many (``LoadError`` past it)."""
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _check(os.fstat(dfd), f"the directory {parent} of the {kind} {path}")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFileError(f"the {kind} {path} is not a regular file: refused, nothing loaded")
        _check(st, f"the {kind} {path}")
        if max_bytes is not None:
            from reshardctl.bounded_load import read_fd

            return read_fd(fh.fileno(), max_bytes)
        return fh.read()


__all__ = ["UntrustedFileError", "not_private", "read_trusted"]
