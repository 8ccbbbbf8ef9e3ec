"""The report's data layer from a real week (tests/helpers/report_week.py): every source's refits against
summary.json and the raw events, an API events_dir read as a run, the ledger's decisions as marks, and a
site's week from its ledger."""

from __future__ import annotations

import calendar
import json
import shutil
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshardctl.errors import InputError, LedgerError
from reshardctl.report import history
from reshardctl.report.collect import expectations, is_refit_phase, load_run_data
from reshardctl.runbook import ledger

from helpers.report_week import API_STEPS, Week, make_week


@pytest.fixture(scope="module")
def week(tmp_path_factory) -> Week:
    return make_week(tmp_path_factory.mktemp("report-data"))


def _events(events: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(events.glob("rank-*.jsonl")) for line in f.read_text().splitlines()
            if line.strip()]


def _ledger_unix(stamp: str) -> float:
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(frac) / 1000


def test_a_runs_timed_refits_carry_summary_figures_and_warm_ups_are_flagged(week):
    run = load_run_data(week.bench)
    summary = json.loads((week.bench / "summary.json").read_text())
    assert set(run.transports) == {"reshard", "gather_broadcast", "hybrid"}
    for t, s in summary["transports"].items():
        mine = [r for r in run.refits if r.transport == t]
        timed = sorted((r for r in mine if not r.warmup), key=lambda r: r.step)
        assert [r.seconds for r in timed] == s["refit_s"]["all"]  # exactly summary.json's figures, in step order
        assert len([r for r in mine if r.warmup]) == summary["warmup"] == 1
        warm = next(r for r in mine if r.warmup)
        assert warm.step < min(r.step for r in timed) and all(r.ok for r in mine)
        # the events that say warmup are the warm-up step's, and its segments carry the flag
        flagged = {e["step"] for e in _events(week.bench / "events") if e.get("warmup") and e.get("plan") == t}
        assert flagged == {warm.step}
        assert {s.step for s in run.segments if s.warmup and s.transport == t} == {warm.step}
    assert [r.start_unix for r in run.refits] == sorted(r.start_unix for r in run.refits)


def test_an_api_events_dir_reads_as_a_run_whose_refits_are_the_slowest_rank(week):
    run = load_run_data(week.api)
    assert run.api and run.label == "api-refits" and not (week.api / "summary.json").exists()
    # independently: per step, per rank last end - first start of its refit phases; the slowest rank
    span: dict[int, dict[int, list[float]]] = defaultdict(dict)
    for e in _events(week.api / "events"):
        if is_refit_phase(e["phase"]) and "step" in e:
            lo, hi = span[e["step"]].get(e["rank"], [float("inf"), 0.0])
            span[e["step"]][e["rank"]] = [min(lo, e["start"]), max(hi, e["start"] + e["duration_s"])]
    want = {step: max(hi - lo for lo, hi in ranks.values()) for step, ranks in span.items()}
    assert sorted(want) == list(API_STEPS)
    assert [(r.step, r.transport, r.warmup, r.ok) for r in run.refits] == [(s, "reshard", False, True) for s in API_STEPS]
    assert [r.seconds for r in run.refits] == pytest.approx([want[s] for s in API_STEPS], abs=2e-6)
    assert [r.start_unix for r in run.refits] == pytest.approx(
        [min(lo for lo, _ in span[s].values()) for s in API_STEPS], abs=2e-6)
    s = run.transports["reshard"]
    assert s["refit_s"]["all"] == [r.seconds for r in run.refits] and s["iterations"] == len(API_STEPS)
    assert s["refit_s"]["median"] == sorted(s["refit_s"]["all"])[1] and s["verified"] is True
    # the events/ directory itself reads the same
    again = load_run_data(week.api / "events")
    assert again.label == "api-refits" and again.refits == run.refits


def test_a_failed_attempt_is_a_refit_that_is_not_ok(week, tmp_path):
    """A rank's attempt event whose outcome is an error (as a verification drill leaves it)."""
    run_dir = tmp_path / "run"
    shutil.copytree(week.rollback, run_dir)
    f = run_dir / "events" / "rank-3.jsonl"
    lines = f.read_text().splitlines()
    timed = [i for i, line in enumerate(lines) if '"phase":"attempt"' in line.replace(" ", "")
             and not json.loads(line).get("warmup")]
    ev = json.loads(lines[timed[-1]])
    lines[timed[-1]] = json.dumps({**ev, "outcome": "VerificationError: refit of step 9 not committed"})
    f.write_text("\n".join(lines) + "\n")
    run = load_run_data(run_dir)
    failed = [r for r in run.refits if not r.ok]
    assert [(r.step, r.seconds, r.warmup) for r in failed] == [(ev["step"], ev["duration_s"], False)]
    assert any(s.error == "VerificationError" and s.phase == "attempt" for s in run.segments)


def test_expectations_span_each_transports_refits(week):
    run = load_run_data(week.bench)
    summary = json.loads((week.bench / "summary.json").read_text())
    exp = {e.transport: e for e in expectations(run)}
    assert set(exp) == set(summary["transports"])
    for t, e in exp.items():
        assert e.predicted_s == summary["transports"][t]["predicted_s"]
        assert e.lower_bound_s == summary["transports"][t]["lower_bound_s"]
        mine = [r for r in run.refits if r.transport == t]
        assert e.start_unix == min(r.start_unix for r in mine)
        assert e.end_unix == max(r.start_unix + r.seconds for r in mine)


def test_one_history_per_site_and_model_with_budget_and_the_ledgers_decisions_as_marks(week):
    runs = [load_run_data(d) for d in (week.bench, week.api, week.rollback)]
    ledgers = history.site_ledgers(runs)
    (h,) = history.histories(runs, ledgers)  # the API refits join the runs' panel
    assert (h.site, h.model, h.budget_s) == ("local", "small", 60)
    assert len(h.refits) == sum(len(r.refits) for r in runs)
    entries = [json.loads(line) for line in (week.state / "local.ledger.jsonl").read_text().splitlines()]
    decisions = [e for e in entries if e["action"] != "measure"]
    assert [(m.action, m.verdict, m.transport) for m in h.marks] == [
        (e["action"], e["verdict"], e["transport"]) for e in decisions]
    assert [m.time_unix for m in h.marks] == pytest.approx([_ledger_unix(e["time"]) for e in decisions], abs=1e-6)
    labels = [m.label for m in h.marks]
    assert labels[0] == f"promote {week.promoted} refused"
    assert labels[1] in (f"promoted {week.promoted}", f"forced {week.promoted}")
    assert labels[2] == "rollback (verified)"
    assert [m.changes_active for m in h.marks] == [False, True, True]
    # --site names the ledger for every run: the same marks
    (h2,) = history.histories(runs, history.site_ledgers(runs, week.site), week.site)
    assert h2.marks == h.marks


def test_an_unloadable_profile_or_a_missing_ledger_says_why_and_a_corrupt_ledger_is_refused(week, tmp_path):
    led = history.read_site(str(tmp_path / "nope.yaml"))
    assert not led.entries and "cannot be loaded" in led.note and "nope.yaml" in led.note
    from helpers.runbook_helpers import site_profile

    fresh = site_profile(tmp_path, "fresh", budget_s=5, state_dir=tmp_path / "fresh-state")
    led = history.read_site(fresh)
    assert led.budget_s == 5 and not led.entries and "no ledger" in led.note
    bad = site_profile(tmp_path, "bad", budget_s=5, state_dir=tmp_path / "bad-state")
    (tmp_path / "bad-state").mkdir()
    (tmp_path / "bad-state" / "local.ledger.jsonl").write_text('{"v": 1, "time": \n')
    with pytest.raises(LedgerError, match="local.ledger.jsonl"):
        history.read_site(bad)


def test_a_sites_week_lists_the_run_dirs_its_ledger_names_and_those_gone(tmp_path, week):
    path = tmp_path / "site.ledger.jsonl"
    gone = str(tmp_path / "deleted-run")
    with ledger.transaction(path) as txn:
        for d in (str(week.bench), gone, str(week.rollback), str(week.bench)):
            txn.append(ledger.stamped({"site": "local", "action": "measure", "transport": "reshard", "run_dir": d,
                                       "verdict": "within_budget"}))
    here, missing = history.week_run_dirs(ledger.read_ledger(path))
    assert here == [str(week.bench), str(week.rollback)] and missing == [gone]


@given(st.integers(0, 4_000_000_000), st.integers(0, 999))
def test_ledger_times_read_back_as_the_unix_time_they_stamp(sec, ms):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{ms:03d}Z"
    t = history.entry_time(ledger.Entry(site="s", action="promote", transport="t", verdict="promoted", time=stamp))
    assert t == pytest.approx(sec + ms / 1000, abs=1e-6)


def test_no_run_directory_is_an_error_naming_what_to_give():
    from reshardctl.report.collect import load_runs

    with pytest.raises(InputError, match="at least one run directory"):
        load_runs([])


_phase = st.tuples(st.sampled_from(["round/transfer", "round/unpack", "bucket/gather", "verify", "commit", "decide"]),
                   st.integers(0, 3), st.integers(1, 4), st.integers(0, 50_000).map(lambda ms: ms / 1000),
                   st.integers(0, 5_000).map(lambda us: us / 1e6))  # the events' microsecond resolution


@given(st.lists(_phase, min_size=1, max_size=40))
def test_an_api_refits_latency_is_its_slowest_ranks_span_for_any_events(phases):
    """Events of any ranks, steps and overlaps: each step's refit = max over ranks of (last end - first start
    of that rank's refit phases); ``decide`` is no refit phase; every step with a refit phase is one refit."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        events = Path(d) / "events"
        events.mkdir()
        t0 = 1_800_000_000.0
        for rank in range(4):
            lines = [json.dumps({"phase": p, "rank": r, "side": "train" if r < 2 else "infer", "start": t0 + s,
                                 "duration_s": dur, "step": step})
                     for p, r, step, s, dur in phases if r == rank]
            (events / f"rank-{rank}.jsonl").write_text("".join(line + "\n" for line in lines))
        run = load_run_data(d)
    want: dict[int, dict[int, list[float]]] = defaultdict(dict)
    for p, r, step, s, dur in phases:
        if p != "decide":
            lo, hi = want[step].get(r, [float("inf"), -float("inf")])
            want[step][r] = [min(lo, s), max(hi, s + dur)]
    assert [r.step for r in run.refits] == sorted(want, key=lambda k: (min(lo for lo, _ in want[k].values()), k))
    got = {r.step: r for r in run.refits}
    for step, ranks in want.items():
        assert got[step].seconds == pytest.approx(max(hi - lo for lo, hi in ranks.values()), abs=1e-6)
        assert got[step].start_unix == pytest.approx(t0 + min(lo for lo, _ in ranks.values()), abs=1e-6)
    assert run.api and {t: s["iterations"] for t, s in run.transports.items()} == ({"unknown": len(want)} if want else {})
