"""A run directory: everything a runbook needs to trust or reproduce a refit run.

```
runs/<UTC time>-<label>/
  command.txt        the command line that produced it
  plan-<t>.npz       the plan of each transport (reshardctl/plan/serialize.py)
  plan.json          the plan report (predicted times, lower bound, bytes)
  events/rank-N.jsonl one JSON line per phase per rank (written by the ranks)
  summary.json       per transport: refit seconds (median/p90), bytes, GB/s, verified, failures
```
Files are written atomically (temp file + rename); a run that fails still leaves its events and a
summary that says what failed.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from reshardctl.atomic_write import write_json_atomic

DEFAULT_BASE = "runs"


def new_run_dir(out: str | os.PathLike | None, label: str) -> Path:
    """``out`` if given (created; must be empty or absent), else ``runs/<UTC time>-<label>[-k]``."""
    if out is not None:
        path = Path(out)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from reshardctl.errors import OutputError

            raise OutputError(f"--out {out}: cannot create the run directory: {exc.strerror or exc}") from exc
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = Path(DEFAULT_BASE)
    base.mkdir(parents=True, exist_ok=True)
    for k in range(1000):
        path = base / (f"{stamp}-{label}" + (f"-{k}" if k else ""))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory under {base}")


def write_json(path: Path, data: Any) -> Path:
    """Atomic JSON write (mode 0o644 whatever the umask)."""
    return write_json_atomic(path, data, mode=0o644, indent=2, default=str)


def write_command(path: Path, argv: list[str] | None = None) -> Path:
    argv = list(sys.argv if argv is None else argv)
    if argv:
        argv[0] = Path(argv[0]).name
    target = path / "command.txt"
    target.write_text(shlex.join(argv) + "\n")
    return target
