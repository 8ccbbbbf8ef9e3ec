"""Collect a run started earlier (detached, submitted by hand, or whose launcher is gone): its launcher
(``launch/launcher.launcher_of_run``) says how it ended, and the summary is written from ``session.json``
exactly as an attached run's (``runs/session.finish``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from reshardctl.bounded_load import LoadError, loads_json, read_text
from reshardctl.errors import InputError
from reshardctl.launch.launcher import Outcome, launcher_for, launcher_of_run
from reshardctl.layout.layout_file import MAX_WORLD
from reshardctl.runs.session import SESSION_JSON, SessionResult, finish

MAX_SESSION_BYTES = 64 << 20  # session.json


def read_session_context(run_dir: Path) -> dict:
    """``session.json`` of a run directory, bounded (a regular file of at most ``MAX_SESSION_BYTES``), with
    the keys collecting reads checked: ``world`` (1..MAX_WORLD ranks, reports are read per rank) and
    ``transports``."""
    path = run_dir / SESSION_JSON
    try:
        ctx = loads_json(read_text(path, MAX_SESSION_BYTES))
    except LoadError as exc:
        if exc.missing:
            raise InputError(f"{run_dir}: not a reshardctl run directory (no {SESSION_JSON})") from None
        raise InputError(f"{path}: cannot be read: {exc}") from None
    if not isinstance(ctx, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(ctx).__name__}")
    world = ctx.get("world")
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= MAX_WORLD:
        raise InputError(f"{path}: `world` must be a number of ranks from 1 to {MAX_WORLD:,} (MAX_WORLD), "
                         f"got {str(world)[:40]}")
    names = ctx.get("transports")
    if not isinstance(names, (list, dict)) or not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"{path}: `transports` must name the run's transports, got {str(names)[:80]!r}")
    return ctx


def _finish_collected(run_dir: Path) -> Callable[[dict, Outcome], tuple]:
    def done(ctx: dict, outcome: Outcome) -> tuple:
        return finish(ctx, outcome, run_dir, who=ctx.get("started_by") or {}, started=time.time(), collected=True)
    return done


def collect_session(run_dir: str | Path, *, wait: bool = False, job: str | None = None,
                    on_state: Callable[[dict], None] | None = None) -> SessionResult:
    """The summary of a (detached) run once its ranks ended; ``wait`` watches them until then. ``job``: the
    job id of a run submitted by hand from `reshardctl plan --out DIR`. Raises ``LaunchError`` when the
    ranks still run and ``wait`` is off, or when the run's launcher is gone without a summary (its
    ``run.json`` settled)."""
    run_dir = Path(run_dir)
    launcher = launcher_of_run(run_dir, job)
    launcher.check_collect(run_dir, job)  # before anything is read or run
    ctx = read_session_context(run_dir)
    outcome = launcher.collect(run_dir, ctx, wait=wait, job=job, on_state=on_state)
    summary, err = _finish_collected(run_dir)(ctx, outcome)
    return SessionResult(run_dir, summary, err, {}, launched=outcome.handle)


def settle_run(run_dir: str | Path, live: dict, launcher: str) -> str | None:
    """A run of ``launcher`` (a name) whose ``run.json`` is not final although no launcher of it runs here
    and its ranks ended (``live``: the queue's states): collected, so that ``summary.json`` and
    ``run.json`` say how it ended. Returns the new state, or None when there is nothing to settle (yet)."""
    run_dir = Path(run_dir)
    return launcher_for(launcher).settle(run_dir, live, _finish_collected(run_dir), read_session_context)
