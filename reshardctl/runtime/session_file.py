"""The session file: what every rank of a run loads, whichever launcher started it.

One format for both launchers: a pickle of ``{"plans": {name: plan}, "options": RunOptions, "warmup": n,
"fallback": plan | None}``. The plans are the planner's own objects (``plan/refit_plan.Plan``; any
``ExecutablePlan`` will do): each rank derives its own steps from them (``compile_program``), never
every rank's steps written out. Written 0600 into the run directory (Slurm: ``session.pkl``, with the
run token in the options; local: ``.ranks-<hex>.pickle``, without the token, which reaches the ranks by
the start method's pipe, deleted when the run ends); read only through ``trusted_file.read_trusted`` (this user's
file in this user's directory, nobody else can write either).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from reshardctl.atomic_write import atomic_open
from reshardctl.errors import InputError
from reshardctl.runtime.contract import RunOptions
from reshardctl.runtime.trusted_file import read_trusted

SESSION_FILE = "session.pkl"  # the Slurm launcher's (and `plan --out`'s), in the run directory


@dataclass(frozen=True)
class Session:
    plans: dict  # name -> plan, run in this order
    options: RunOptions
    warmup: int
    fallback: object | None  # the gather-and-broadcast plan of --on-failure fallback


def session_bytes(plans: Mapping[str, object], options: RunOptions, warmup: int, fallback=None) -> bytes:
    """The content of a session file (the run token travels in ``options`` where it is set)."""
    return pickle.dumps({"plans": dict(plans), "options": options, "warmup": warmup, "fallback": fallback},
                        protocol=pickle.HIGHEST_PROTOCOL)


def write_session(path: str | Path, plans: Mapping[str, object], options: RunOptions, warmup: int,
                  fallback=None) -> Path:
    """Write the session file at ``path`` whole (temp file + rename), 0600."""
    with atomic_open(path, binary=True, mode=0o600) as fh:
        fh.write(session_bytes(plans, options, warmup, fallback))
    return Path(path)


def read_session(path: str | Path) -> Session:
    """The session file at ``path``, loaded only when it is trusted (``UntrustedFileError``, exit 2);
    ``InputError`` (exit 2) naming the file when it is missing, unreadable or not a session file."""
    try:
        spec = pickle.loads(read_trusted(str(path), "session file"))
        plans, options, warmup = spec["plans"], spec["options"], spec["warmup"]
        fallback = spec.get("fallback")
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"cannot read the session file {path}: {exc}") from None
    if not isinstance(plans, dict) or not plans or not isinstance(options, RunOptions):
        raise InputError(f"the session file {path} holds no plans and run options")
    return Session(plans, options, warmup, fallback)
