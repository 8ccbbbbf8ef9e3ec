"""Why a Slurm session failed, in one paragraph: a batch script's own failure line first (its ``fail``:
``reshardctl: error: ...``), the jobs that did not complete, then the ranks (the root cause once, the
knock-on failures summarised), then the end of each batch script's output; and the bounded tail of a log
that these quote."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from reshardctl.bounded_load import LoadError, open_regular
from reshardctl.launch.cancellation import cancelled_text
from reshardctl.launch.failures import failure_line, knock_on_text, order_failures, ranks_text
from reshardctl.launch.slurm_request import FAIL_MARK
from reshardctl.runtime.contract import RankReport

if TYPE_CHECKING:
    from reshardctl.launch.slurm import SlurmRun, Watch

TAIL_BYTES = 64 << 10  # the end of a log that failure messages quote


def tail_lines(path: Path, lines: int = 8) -> str:
    """The last ``lines`` lines of a log (at most its last ``TAIL_BYTES`` read; "" when it cannot be read)."""
    try:
        fd = open_regular(path)
    except LoadError:
        return ""
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - TAIL_BYTES), os.SEEK_SET)
        text = os.read(fd, TAIL_BYTES).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
    return "\n".join(text.strip().splitlines()[-lines:])


def failure_message(run: "SlurmRun", w: "Watch", lost: Mapping[int, str], failed: list[RankReport],
                    cancelled: Mapping | None = None) -> str | None:
    """Why the Slurm session failed, in one paragraph, or None when it did not; a run a person
    cancelled (``cancelled``: launch/cancellation.py) says so first."""
    bad_jobs = {j: s for j, s in w.states.items() if s.state != "COMPLETED"}
    missing = [j for j in run.ids if j not in w.states]
    if not (bad_jobs or lost or failed or w.interrupted):
        return None
    lines = [cancelled_text(cancelled)] if cancelled else []
    batch = sorted((Path(run.run_dir) / "slurm").glob("*.out"))
    # a batch script that failed on its own (fail(): a peer that never started, a module that did not load)
    # says why in its output: that line is the run's first cause, before the jobs' states and the ranks
    for p in batch:
        said = [ln[len(FAIL_MARK):] for ln in tail_lines(p, 20).splitlines() if ln.startswith(FAIL_MARK)]
        if said:
            lines.append(f"{p.name}: {said[-1]}")
    for j, s in bad_jobs.items():
        extra = f", exit {s.exit_code}" if s.exit_code and s.exit_code != "0:0" else ""
        reason = f", reason {s.reason}" if s.reason and s.reason != "None" else ""
        lines.append(f"Slurm job {j}: {s.state}{extra}{reason}")
    for j in missing:
        lines.append(f"Slurm job {j}: no accounting record (sacct)")
    if w.cancelled_peer:
        lines.append(f"cancelled the other job ({w.cancelled_peer}) when this one ended")
    # the ranks: those that left no report first (identical causes grouped), then those that failed on
    # their own, then the knock-on failures (launch/failures.py's order); the root cause once, in full,
    # every other rank summarised in one line (each rank's record is in summary.json)
    by_why: dict[str, list[int]] = {}
    for r, why in sorted(lost.items()):
        by_why.setdefault(why, []).append(r)
    recs = order_failures([], failed)
    if by_why:
        why, rs = next(iter(by_why.items()))
        root = f"{ranks_text(rs)}: {why}"
        others = [{"rank": r, "error": "RankLost"} for r in sorted(lost) if r not in rs] + recs
    elif recs:
        root, others = failure_line(recs[0]), recs[1:]
    if by_why or recs:
        lines.append(f"root cause: {root}")
        if others:
            lines.append(knock_on_text(others))
    if not lines:
        return None
    if cancelled:
        return "Slurm run cancelled:\n  " + "\n  ".join(lines)
    tails = [f"{p.name}:\n      " + tail_lines(p, 5).replace("\n", "\n      ") for p in batch if tail_lines(p, 5)]
    if tails and (lost or bad_jobs):
        lines.append("batch output: " + "\n    ".join(tails))
    return "Slurm run failed:\n  " + "\n  ".join(lines)
