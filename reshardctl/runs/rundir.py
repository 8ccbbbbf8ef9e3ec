"""A run directory: everything a runbook needs to trust or reproduce a refit run.

```
runs/<UTC time>-<label>/
  command.txt        the command line that produced it
  plan-<t>.npz       the plan of each transport (reshardctl/plan_files/serialize.py)
  plan.json          the plan report (predicted times, lower bound, bytes)
  events/rank-N.jsonl one JSON line per phase per rank (written by the ranks)
  run.json           who started it (user, uid, host, pid), when, and its state (running, finished,
                     failed, interrupted); padded to 4 KiB so that a full disk cannot keep it from its
                     final state (then with record_error and the outcome, ``mark_run``)
  summary.json       per transport: refit seconds (median/p90), bytes, GB/s, verified, failures
```
Files are written atomically (temp file + rename); a run that fails still leaves its events and a
summary that says what failed. The directory belongs to the user who runs reshardctl: an existing
``--out`` owned by another user, or writable by group or others, is refused (``check_out_dir``: such a
user could replace the files the ranks load), and so is such a default base ``runs/``; the directory is 0700, every subdirectory 0700 and every
file 0600, on both launchers (the session runs under ``private_umask()``, so the ranks, ``sbatch`` and
the jobs Slurm starts create their files private too). A run whose
launcher was killed outright has ``run.json`` saying ``running`` with a pid that is gone: ``run_state``
reads it as ``interrupted``, and ``reshardctl collect`` writes that state (the local launcher's ``settle_local``; a Slurm
run's is settled from its jobs' end, ``runs/collect.settle_run``).
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reshardctl.atomic_write import atomic_open, write_json_atomic, write_text_atomic
from reshardctl.bounded_load import LoadError, loads_json, read_text
from reshardctl.errors import InputError, OutputError
from reshardctl.runtime.trusted_file import not_private

DEFAULT_BASE = "runs"
PRIVATE_UMASK = 0o077  # files 0600, directories 0700


@contextmanager
def private_umask() -> Iterator[None]:
    """Run the block with umask 077 (restored after): every file and directory created meanwhile by this
    process and the processes it starts (local ranks, ``sbatch``, whose umask Slurm gives the job and its
    ``--output`` file) is private to the user, whatever the code that creates it."""
    old = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(old)


def check_dir_owner(path: str | os.PathLike, flag: str = "--out") -> None:
    """Refuse (``InputError``, exit 2) an existing directory ``path`` that is owned by another user or
    writable by group or others: that user could swap the session file the ranks unpickle."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot read the directory: {exc.strerror or exc}") from exc
    why = not_private(st)
    if why:
        raise InputError(f"{flag} {path}: it {why}; a run directory must belong to the user who runs reshardctl "
                         f"and be writable by nobody else (another user could replace the files the ranks "
                         f"load); choose a directory of your own, or remove it first")


def _refuse_to_empty(path: Path) -> str | None:
    """Why ``--force`` must not empty ``path`` (the filesystem root, the home directory, or the working
    directory or one above it), else None."""
    p = path.resolve()
    if p == Path(p.anchor) or p == Path.home().resolve():
        return "it is the filesystem root or the home directory"
    cwd = Path.cwd().resolve()
    if p == cwd or p in cwd.parents:
        return "it is the working directory or holds it"
    return None


def _empty_dir(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def check_out_dir(out: str | os.PathLike | None, force: bool = False) -> None:
    """Refuse (``InputError``, exit 2) an ``--out`` that is an existing non-empty directory unless
    ``force`` (then it is emptied by ``new_run_dir``), or that exists and is not a directory. Nothing is
    written: callers check this before any side effect."""
    if out is None:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if path.is_dir():
        check_dir_owner(path)
        try:
            nonempty = any(path.iterdir())
        except OSError as exc:
            raise InputError(f"--out {out}: cannot read the directory: {exc.strerror or exc}") from exc
        if nonempty and not force:
            raise InputError(f"--out {out}: the directory is not empty (an old run's events and plan files would "
                             f"mix with this run's); choose another directory, or add --force to empty it first")
        if nonempty:
            why = _refuse_to_empty(path)
            if why:
                raise InputError(f"--out {out}: --force will not empty it: {why}")


def new_run_dir(out: str | os.PathLike | None, label: str, force: bool = False) -> Path:
    """``out`` if given (created; an existing non-empty directory is refused unless ``force``, which
    empties it first), else ``runs/<UTC time>-<label>[-k]``; private to the user (0700). An existing one
    must be the user's own (``check_dir_owner``); it is checked again once made (a directory someone
    else created in between is refused). So must ``runs/`` itself: another user who owns it, or may
    write it, could rename the new run directory away and put one of theirs in its place."""
    if out is not None:
        check_out_dir(out, force)
        path = Path(out)
        try:
            if force and path.is_dir():
                _empty_dir(path)
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            check_dir_owner(path)
            path.chmod(0o700)
        except OSError as exc:
            raise OutputError(f"--out {out}: cannot create the run directory: {exc.strerror or exc}") from exc
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = Path(DEFAULT_BASE)
    base.mkdir(parents=True, exist_ok=True)
    check_dir_owner(base, "the default base directory (no --out)")
    for k in range(1000):
        path = base / (f"{stamp}-{label}" + (f"-{k}" if k else ""))
        try:
            path.mkdir(mode=0o700)
            path.chmod(0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory under {base}")


def write_json(path: Path, data: Any) -> Path:
    """Atomic JSON write, private to the user (0600)."""
    return write_json_atomic(path, data, mode=0o600, indent=2, default=str)


def write_command(path: Path, argv: list[str] | None = None) -> Path:
    argv = list(sys.argv if argv is None else argv)
    if argv:
        argv[0] = Path(argv[0]).name
    return write_text_atomic(path / "command.txt", shlex.join(argv) + "\n", mode=0o600)


def started_by() -> dict:
    """Who started this run: user name, uid, host, pid."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"user": user, "uid": os.getuid(), "host": socket.gethostname(), "pid": os.getpid()}


RUN_JSON_BYTES = 4096  # run.json is written padded to this size: its space is held from the start


def _padded(rec: dict, size: int) -> bytes | None:
    """``rec`` as JSON, padded with spaces (valid JSON whitespace) to ``size`` bytes; None if it is longer."""
    text = json.dumps(rec, indent=2, default=str).encode()
    return text + b" " * (size - len(text) - 1) + b"\n" if len(text) < size else None


def _rewrite_in_place(path: Path, rec: dict) -> None:
    """Overwrite the existing ``path`` within its own bytes (no new blocks: works on a full disk);
    ``rec``'s ``result`` and then the tail of its ``record_error`` are dropped until it fits."""
    size = path.stat().st_size
    body = _padded(rec, size)
    if body is None:
        rec = {k: v for k, v in rec.items() if k != "result"}
        body = _padded(rec, size)
    if body is None and rec.get("record_error"):
        body = _padded({**rec, "record_error": str(rec["record_error"])[:200]}, size)
    if body is None:
        raise OSError(28, "run.json's reserved space is too small for its final state", str(path))
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.pwrite(fd, body, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_run(path: Path, state: str, who: dict, started: float, **extra: Any) -> Path:
    """``run.json``: who started the run, when, where it stands, and ``extra`` fields (``record_error``:
    a file the disk refused; ``result``: the refit's outcome when ``summary.json`` could not be written).
    Written whole (temp file + rename), padded to ``RUN_JSON_BYTES`` so that its space is held: when the
    disk refuses the new file (full), the existing ``run.json`` is rewritten within its own bytes, so a
    run always reaches a final state. ``OSError`` (naming run.json) only when both fail."""
    rec = {"state": state, "started_by": who, "started_at": started, "updated_at": time.time(),
           **{k: v for k, v in extra.items() if v is not None}}
    target = path / "run.json"
    body = _padded(rec, RUN_JSON_BYTES) or (json.dumps(rec, indent=2, default=str) + "\n").encode()
    try:
        with atomic_open(target, binary=True, mode=0o600) as fh:
            fh.write(body)
    except OSError:
        if not target.is_file():
            raise
        _rewrite_in_place(target, rec)
    return target


def pid_alive(pid: int) -> bool:
    """Is there a process ``pid`` (one of another user's counts: it exists)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


MAX_RUN_JSON_BYTES = 1 << 20  # run.json as any reader takes it (written padded to RUN_JSON_BYTES)


def run_state(path: str | os.PathLike) -> str:
    """``finished``, ``failed``, ``interrupted`` or ``running`` (a live launcher on this host);
    ``unknown`` for a directory without ``run.json``. A ``running`` mark whose launcher is gone (killed
    before it could write its summary) reads as ``interrupted``. ``InputError`` as ``read_run``."""
    rec = read_run(path)
    if rec is None:
        return "unknown"
    state = rec.get("state", "unknown")
    if state == "running" and launcher_alive(rec) is False:
        return "interrupted"
    return state


def read_run(path: str | os.PathLike) -> dict | None:
    """``run.json`` as written by ``mark_run``, or None when it is missing. Read through ``bounded_load``:
    a FIFO, a device or a symlink to one, a file over ``MAX_RUN_JSON_BYTES``, and anything but a JSON
    object (with ``started_by`` an object) are an ``InputError`` naming the file (never a hang)."""
    target = Path(path) / "run.json"
    try:
        rec = loads_json(read_text(target, MAX_RUN_JSON_BYTES))
    except LoadError as exc:
        if exc.missing:
            return None
        raise InputError(f"{target}: cannot be read: {exc}") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("started_by", {}), dict):
        raise InputError(f"{target}: expected a JSON object with `started_by` an object, as reshardctl writes it")
    return rec


def launcher_alive(rec: dict) -> bool | None:
    """Is the process that wrote ``rec`` (run.json) still running? None when it ran on another host."""
    who = rec.get("started_by") or {}
    if who.get("host") != socket.gethostname():
        return None
    try:
        pid = int(who.get("pid", 0))
    except (TypeError, ValueError):
        return False
    return pid > 0 and pid_alive(pid)


def settle(path: str | os.PathLike, state: str, why: str, was: str | None = None) -> Path:
    """Give ``run.json`` of a run whose launcher ended without doing so its final ``state``, and say why
    (``settled``: the state it had, ``was`` or the file's, and why it changed)."""
    rec = read_run(path) or {}
    data = {"state": state, "started_by": rec.get("started_by") or {}, "started_at": rec.get("started_at"),
            "updated_at": time.time(), "settled": {"from": was or rec.get("state"), "why": why}}
    return write_json(Path(path) / "run.json", data)
