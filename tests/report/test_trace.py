"""`reshardctl trace RUN_DIR`: a real run's events as a Chrome/Perfetto trace (report/trace.py), and the
inputs it refuses or skips."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.cli import main
from reshardctl.report.trace import LANE_STRIDE, TOLERANCE_US, build_trace

from helpers.report_week import API_STEPS, api_events
from helpers.small_llama import SMALL_LLAMA

REFIT_PHASES = ("round/", "bucket/", "verify", "commit")


def _run(tmp_path_factory, name: str, *extra: str) -> Path:
    """One real local run: tiny llama, 2 trainer + 2 inference gloo ranks, 2 timed refits."""
    base = tmp_path_factory.mktemp(name)
    (base / "small").mkdir()
    (base / "small" / "config.json").write_text(json.dumps(SMALL_LLAMA))
    out = base / "run"
    with pytest.MonkeyPatch.context() as mp:  # no test reads the user's calibrations or ledgers
        mp.setenv("XDG_STATE_HOME", str(base / "state"))
        main(["run", "--model", str(base / "small" / "config.json"), "--train", "tp=2", "--infer", "tp=2",
              "--iters", "2", "--transport", "reshard", "--out", str(out), *extra])
    assert (out / "events").is_dir()
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = _run(tmp_path_factory, "trace-ok")
    assert json.loads((out / "summary.json").read_text())["ok"]
    return out


@pytest.fixture(scope="module")
def drill_dir(tmp_path_factory) -> Path:
    out = _run(tmp_path_factory, "trace-drill", "--inject", "corrupt:rank=3:step=2")
    assert not json.loads((out / "summary.json").read_text())["ok"]
    return out


def _copy(run: Path, dest: Path) -> Path:
    """A copy of a run directory (the module's runs stay as they were)."""
    shutil.copytree(run, dest)
    return dest


def _lines(events: Path) -> int:
    return sum(1 for f in events.glob("rank-*.jsonl") for line in f.read_text().splitlines() if line.strip())


def assert_tracks_nest(trace: dict) -> None:
    """On every track, each complete slice starts after the previous one ended or ends inside it."""
    by_tid: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0, e
            by_tid.setdefault(e["tid"], []).append(e)
    for tid, slices in by_tid.items():
        stack: list[int] = []
        for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
            while stack and stack[-1] <= s["ts"]:
                stack.pop()
            assert not stack or s["ts"] + s["dur"] <= stack[-1], (tid, s)
            stack.append(s["ts"] + s["dur"])


def assert_refit_phases_nest(slices: list[dict]) -> None:
    """Every round, bucket, verify and commit slice lies inside a refit slice of its rank and step."""
    refits = [s for s in slices if s["cat"] == "refit"]
    for p in slices:
        if not p["name"].startswith(REFIT_PHASES) or p["args"].get("step") is None:
            continue
        rank, step = p["tid"] % LANE_STRIDE, p["args"]["step"]
        around = [r for r in refits if r["tid"] % LANE_STRIDE == rank and r["args"]["step"] == step]
        assert any(r["ts"] <= p["ts"] and p["ts"] + p["dur"] <= r["ts"] + r["dur"] for r in around), p


def test_a_run_opens_as_a_trace_with_a_track_per_rank_and_refits_around_their_phases(run_dir, tmp_path, capsys):
    run = _copy(run_dir, tmp_path / "run")
    assert main(["trace", str(run)]) == 0
    io = capsys.readouterr()
    assert io.out.strip() == str(run / "trace.json")
    assert "ui.perfetto.dev" in io.err and "Traceback" not in io.err
    assert stat.S_IMODE((run / "trace.json").stat().st_mode) == 0o600
    trace = json.loads((run / "trace.json").read_text())
    ev = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert {t: n for t, n in names.items() if t < LANE_STRIDE} == {
        0: "trainer 0", 1: "trainer 1", 2: "inference 2", 3: "inference 3"}
    slices = [e for e in ev if e["ph"] == "X"]
    assert len(slices) == _lines(run / "events") == trace["otherData"]["events"]  # every event, none dropped
    assert trace["otherData"]["derived_refits"] == 0  # a run's refits are its attempt events
    assert trace["otherData"]["skipped_lines"] == 0 and not [e for e in ev if e["ph"] == "i"]
    assert min(s["ts"] for s in slices) == 0
    assert_tracks_nest(trace)
    # 1 warm-up + 2 timed refits per rank, each a slice around its rounds, verify and commit
    refits = [s for s in slices if s["cat"] == "refit"]
    assert sorted(s["name"] for s in refits if s["tid"] % LANE_STRIDE == 0) == [
        "refit step 1 (warm-up)", "refit step 2", "refit step 3"]
    assert len(refits) == 4 * 3
    phases = [s for s in slices if s["name"].startswith(REFIT_PHASES)]
    assert {s["cat"] for s in phases} >= {"round", "verify", "commit"}
    assert_refit_phases_nest(slices)
    assert all(p["args"]["transport"] == "reshard" for p in phases)
    assert any(s["name"].startswith("round/transfer r") and s["args"]["bytes"] > 0 for s in phases)


def test_a_fault_drill_is_an_instant_and_the_failures_carry_their_error(drill_dir, tmp_path, capsys):
    out = tmp_path / "drill.json"
    assert main(["trace", str(drill_dir), "--out", str(out)]) == 0
    trace = json.loads(out.read_text())
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    drills = [e for e in instants if e["cat"] == "drill"]
    assert [(d["tid"], d["args"]["step"]) for d in drills] == [(3, 2)]
    failures = [e for e in instants if e["cat"] == "failure"]
    assert {f["tid"] for f in failures} == {0, 1, 2, 3}  # the root cause and the 3 ranks it stopped
    assert all(f["args"]["step"] == 2 and "not committed" in f["args"]["error"] for f in failures)
    assert any("checksum mismatch" in f["args"]["error"] for f in failures)
    assert all(f["ts"] >= drills[0]["ts"] for f in failures)
    assert_tracks_nest(trace)
    assert not (drill_dir / "trace.json").exists()


def test_an_api_refits_events_dir_traces_without_a_summary(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(SMALL_LLAMA))
    events = api_events(tmp_path, str(cfg))  # a 4-rank RL job's refits through Refitter(events_dir=...)
    assert not (events / "summary.json").exists()
    assert main(["trace", str(events)]) == 0
    trace = json.loads((events / "trace.json").read_text())
    assert trace["otherData"]["events"] == _lines(events / "events") and trace["otherData"]["ranks"] == 4
    refits = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "refit" and e["tid"] < LANE_STRIDE]
    # the API writes no attempt events: each rank's refit is derived from its phases
    assert sorted(r["name"] for r in refits) == [f"refit step {s}" for s in API_STEPS for _ in range(4)]
    assert all(r["args"]["derived"] for r in refits) and trace["otherData"]["derived_refits"] == 4 * len(API_STEPS)
    assert_refit_phases_nest([e for e in trace["traceEvents"] if e["ph"] == "X"])
    assert_tracks_nest(trace)
    # the events/ directory itself (its rank-N.jsonl files alone) traces the same
    assert main(["trace", str(events / "events"), "--out", str(tmp_path / "t.json")]) == 0
    again = json.loads((tmp_path / "t.json").read_text())
    assert again["traceEvents"][1:] == trace["traceEvents"][1:]  # the process is named after the directory


def test_a_corrupt_line_is_skipped_and_counted_and_a_huge_log_is_skipped_unread(run_dir, tmp_path, capsys):
    run = _copy(run_dir, tmp_path / "run")
    with open(run / "events" / "rank-1.jsonl", "a") as f:
        f.write('{"phase": "commit", "rank": 1, "sta\n[1, 2]\n')
    huge = run / "events" / "rank-9.jsonl"
    with open(huge, "wb") as f:  # sparse: over the 256 MiB bound without the disk space
        f.truncate((256 << 20) + 1)
    assert main(["trace", str(run)]) == 0
    io = capsys.readouterr()
    trace = json.loads((run / "trace.json").read_text())
    assert trace["otherData"]["skipped_lines"] == 2
    assert len(trace["otherData"]["skipped_logs"]) == 1 and str(huge) in trace["otherData"]["skipped_logs"][0]
    assert "2 event line(s) that are not events skipped" in io.err and str(huge) in io.err
    assert trace["otherData"]["events"] == _lines(run_dir / "events")


def test_a_directory_without_events_is_refused_naming_it(tmp_path, capsys):
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert main(["trace", str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "no event logs" in err and "Traceback" not in err
    assert main(["trace", str(tmp_path / "absent")]) == 2
    assert not (empty / "trace.json").exists()


@pytest.mark.parametrize("target", ["fifo", "dir", "missing-parent", "readonly-parent", "proc"])
def test_an_output_that_cannot_be_written_is_refused_and_nothing_is_written(run_dir, tmp_path, capsys, target):
    run = _copy(run_dir, tmp_path / "run")
    out = tmp_path / "t.json"
    if target == "fifo":
        os.mkfifo(out)
    elif target == "dir":
        out.mkdir()
    elif target == "missing-parent":
        out = tmp_path / "no" / "t.json"
    elif target == "proc":
        out = Path("/proc/self/t.json")  # refused by the kernel, root included: the write's own error
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        (tmp_path / "ro").mkdir(mode=0o500)
        out = tmp_path / "ro" / "t.json"
    assert main(["trace", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}" in err and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".t.json")] == []
    assert not (run / "trace.json").exists()


# -- the pure part: any events, any overlap ---------------------------------------------------------

EVENT = st.fixed_dictionaries({
    "phase": st.sampled_from(["attempt", "round/pack", "round/transfer", "verify", "commit", "materialise"]),
    "rank": st.integers(0, 3),
    "side": st.sampled_from(["train", "infer"]),
    "start": st.floats(1.7e9, 1.7e9 + 5, allow_nan=False),
    "duration_s": st.floats(0, 2, allow_nan=False),
    "step": st.integers(1, 3),
})
JUNK = st.one_of(st.fixed_dictionaries({"phase": st.just("x"), "rank": st.sampled_from([-1, True, "0", None])}),
                 st.fixed_dictionaries({"phase": st.just("x"), "rank": st.just(0),
                                        "start": st.sampled_from([None, "1", float("nan"), float("inf")])}))


@settings(max_examples=200, deadline=None)
@given(st.lists(EVENT, max_size=40), st.lists(JUNK, max_size=3))
def test_any_events_give_tracks_that_nest_and_lose_no_event(events, junk):
    trace = build_trace([*events, *junk], name="r")
    assert_tracks_nest(trace)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(events) + trace["otherData"]["derived_refits"]
    assert trace["otherData"]["unusable_events"] == len(junk)
    assert_refit_phases_nest(slices)
    assert sorted(s["tid"] % LANE_STRIDE for s in slices if not s["args"].get("derived")) == sorted(
        e["rank"] for e in events)
    t0 = min((e["start"] for e in events), default=0)
    for e in events:  # each event keeps its start and its duration (an end moves by the rounding at most)
        ts, dur = round((e["start"] - t0) * 1e6), round(e["duration_s"] * 1e6)
        assert any(s["tid"] % LANE_STRIDE == e["rank"] and s["ts"] == ts and abs(s["dur"] - dur) <= TOLERANCE_US
                   for s in slices), e
    named = {e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {s["tid"] for s in slices} <= named
    assert json.loads(json.dumps(trace, allow_nan=False)) == trace
