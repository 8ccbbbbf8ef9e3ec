"""What the fault-drill tests share: the run's options (timeout, margin) and the drill's timings."""

from __future__ import annotations

from reshardctl.runtime.contract import RunOptions
from reshardctl.runs.records import read_events


TIMEOUT = 4.0
MARGIN = 10.0  # generous: 2 shared cores, 4 processes


def opts(tmp_path, **kw) -> RunOptions:
    base = dict(run_dir=str(tmp_path), timeout_s=TIMEOUT, dump_weights=True, device="cpu", iterations=3)
    base.update(kw)
    return RunOptions(**base)


def drill_time(run_dir, rank: int) -> float:
    ev = [e for e in read_events(run_dir / "events" / f"rank-{rank}.jsonl") if e["phase"] == "drill"]
    assert len(ev) == 1
    return ev[0]["start"]


def survivors_detect_within_bound(err, t_drill: float, bound: float) -> list[float]:
    times = [f["at"] - t_drill for f in err.failures if f.get("error") != "RankLost"]
    assert times and all(0 <= t <= bound for t in times), times
    return times
