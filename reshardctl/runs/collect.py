"""Collect a run started earlier (detached, submitted by hand, or whose launcher is gone): its launcher
(``launch/launcher.launcher_of_run``) says how it ended, and the summary is written from ``session.json``
exactly as an attached run's (``runs/session.finish``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from reshardctl.launch.launcher import Outcome, launcher_for, launcher_of_run
from reshardctl.runs.records import read_session
from reshardctl.runs.session import SessionResult, finish

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
    ctx = read_session(run_dir).context
    outcome = launcher.collect(run_dir, ctx, wait=wait, job=job, on_state=on_state)
    summary, err = _finish_collected(run_dir)(ctx, outcome)
    return SessionResult(run_dir, summary, err, {}, launched=outcome.handle)


def settle_run(run_dir: str | Path, live: dict, launcher: str) -> str | None:
    """A run of ``launcher`` (a name) whose ``run.json`` is not final although no launcher of it runs here
    and its ranks ended (``live``: the queue's states): collected, so that ``summary.json`` and
    ``run.json`` say how it ended. Returns the new state, or None when there is nothing to settle (yet)."""
    run_dir = Path(run_dir)
    return launcher_for(launcher).settle(run_dir, live, _finish_collected(run_dir),
                                             lambda d: read_session(d).context)
