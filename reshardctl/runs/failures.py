"""A failed run's story from the launcher's failure records and the ranks' events: root cause first,
knock-on failures counted, detection times measured from the drill (``summary.json``)."""

from __future__ import annotations

from pathlib import Path


def _events_of(run_dir: Path) -> list[dict]:
    from reshardctl.runtime.events import read_events

    out = []
    for f in sorted((run_dir / "events").glob("rank-*.jsonl")):
        try:
            out += read_events(f)
        except (OSError, ValueError):
            pass
    return out



def failure_summary(failures: list[dict], run_dir: Path, timeout_s: float) -> dict:
    """Root cause first, knock-on failures counted, and detection times measured from the drill (or the
    root cause's own time) to each survivor's failure record."""
    drills = [e for e in _events_of(run_dir) if e.get("phase") == "drill"]
    t0 = min((e["start"] for e in drills), default=None)
    if t0 is None and failures and failures[0].get("at"):
        t0 = failures[0]["at"]
    rows = []
    for k, f in enumerate(failures):
        row = {key: f.get(key) for key in ("rank", "host", "side", "side_rank", "phase", "step", "round", "peers",
                                           "error", "message")}
        row["root_cause"] = k == 0
        row["knock_on"] = k > 0
        if t0 is not None and f.get("at") and f.get("error") != "RankLost":
            row["detected_after_s"] = round(f["at"] - t0, 3)
        rows.append(row)
    detected = [r["detected_after_s"] for r in rows if "detected_after_s" in r]
    return {
        "root_cause": rows[0] if rows else None,
        "knock_on_failures": max(0, len(rows) - 1),
        "failures": rows,
        "drills": [{"rank": e.get("rank"), "drill": e.get("drill"), "at": e.get("start")} for e in drills],
        "detection_s": max(detected) if detected else None,
        "timeout_s": timeout_s,
    }
