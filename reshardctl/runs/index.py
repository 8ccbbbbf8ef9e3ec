"""The per-user index of Slurm runs (``reshardctl jobs`` lists it): one JSON line per submitted run.

Kept in the per-user state directory, ``$XDG_STATE_HOME/reshardctl/`` (default
``~/.local/state/reshardctl/``), file ``slurm-runs.jsonl``, appended under an exclusive lock so that
concurrent submissions never lose a line. A line that cannot be read is reported, never rewritten.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from reshardctl.errors import InputError

INDEX = "slurm-runs.jsonl"


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "reshardctl"


def record_run(entry: dict) -> Path:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / INDEX
    line = json.dumps(entry, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock
    return path


def list_runs() -> list[dict]:
    path = state_dir() / INDEX
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"{path}: unreadable ({exc.strerror or exc})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}, line {n}: not a JSON record ({exc}); the file is left as it is") from None
        if not isinstance(entry, dict) or "run_dir" not in entry or "job_ids" not in entry:
            raise InputError(f"{path}, line {n}: not a run record (needs run_dir and job_ids)")
        out.append(entry)
    return out
