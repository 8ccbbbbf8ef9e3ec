"""A run's fault story from the launcher's failure records and the ranks' events: every requested drill
and whether it fired, then, for a failed run, root cause first, knock-on failures counted, detection
times measured from the drill's own event (``summary.json``)."""

from __future__ import annotations

from pathlib import Path

from reshardctl.runs.records import run_events
from reshardctl.runtime.drills import parse_faults
from reshardctl.runtime.failure_record import RANK_LOST, FailureRecord


def drill_rows(faults: str | None, run_dir: Path | None) -> list[dict]:
    """Every drill the run asked for (``--inject``, in order), with ``fired`` and, when it fired, its
    unix time (``at``: the drill event the rank wrote just before it acted) and step. A drill event no
    request names (a rank run with other options) is listed too, as fired."""
    fired = [e for e in run_events(run_dir) if e.get("phase") == "drill"] if run_dir is not None else []
    rows = []
    for f in parse_faults(faults):
        ev = next((e for e in fired if e.get("rank") == f.rank and e.get("drill") == f.describe()), None)
        if ev is not None:
            fired.remove(ev)
        rows.append({"rank": f.rank, "drill": f.describe(), "kind": f.kind, "fired": ev is not None,
                     "at": None if ev is None else ev.get("start"), "step": None if ev is None else ev.get("step")})
    rows += [{"rank": e.get("rank"), "drill": e.get("drill"), "kind": e.get("kind"), "fired": True,
              "at": e.get("start"), "step": e.get("step")} for e in fired]
    return rows


def failure_summary(failures: list[dict], drills: list[dict], timeout_s: float) -> dict:
    """Root cause first, knock-on failures counted, and detection times: from the first drill that
    fired (its event's time) to each survivor's failure record. Without a drill that fired there is no
    fault time to measure from (a rank that died on its own is seen first by its peers, not by the
    launcher), so no detection time is given; a survivor whose record precedes the drill's time (clocks
    of different hosts) gets none either: never a negative figure."""
    t0 = min((d["at"] for d in drills if d.get("fired") and d.get("at") is not None), default=None)
    rows = []
    for k, rec in enumerate(failures):
        f = FailureRecord.from_json(rec)
        row = {key: getattr(f, key) for key in ("rank", "host", "side", "side_rank", "phase", "step", "round", "peers",
                                                "error", "message")}
        row["root_cause"] = k == 0
        row["knock_on"] = k > 0
        if t0 is not None and f.at and f.error != RANK_LOST and f.at >= t0:
            row["detected_after_s"] = round(f.at - t0, 3)
        rows.append(row)
    detected = [r["detected_after_s"] for r in rows if "detected_after_s" in r]
    return {
        "root_cause": rows[0] if rows else None,
        "knock_on_failures": max(0, len(rows) - 1),
        "failures": rows,
        "detection_s": max(detected) if detected else None,
        "timeout_s": timeout_s,
    }
