"""The report page and `reshardctl report` from a real week (tests/helpers/report_week.py): within budget
and what changed, the ledger's decisions, the before/after of the transport that changed, human values in
every table, a site's week from its ledger, and what it refuses."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reshardctl.cli import main
from reshardctl.report.page import human, utc
from reshardctl.runbook import ledger

from helpers.report_week import Week, make_week
from helpers.runbook_helpers import site_profile

UNIX_TIME = re.compile(r"\b1[0-9]{9}(\.[0-9]+)?\b")


@pytest.fixture(scope="module")
def week(tmp_path_factory) -> Week:
    return make_week(tmp_path_factory.mktemp("report-page"))


def _tables(md: str) -> list[list[list[str]]]:
    """Every markdown table: rows of cells (header first, the --- line left out)."""
    tables, cur = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            if not set(line) <= set("|-"):
                cur.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif cur:
            tables.append(cur)
            cur = []
    return tables


def _table_after(md: str, heading: str) -> list[list[str]]:
    return _tables(md[md.index(heading):])[0]


def assert_human(md: str) -> None:
    for table in _tables(md):
        for row in table:
            for cell in row:
                assert not re.search(r"[\[\]{}]|\bTrue\b|\bFalse\b|\bNone\b|\bnan\b", cell), (cell, row)
                assert not UNIX_TIME.search(cell), (cell, row)


def _summary(d: Path) -> dict:
    return json.loads((d / "summary.json").read_text())


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def test_the_page_answers_within_budget_and_what_changed(week, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", str(week.bench), str(week.api), str(week.rollback), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md.index("Within budget, and what changed?") < md.index("# Run bench")
    assert "](latency-over-time.png)" in md and (out / "latency-over-time.png").stat().st_size > 5_000
    assert "## local: small" in md
    rb, bench = _summary(week.rollback), _summary(week.bench)
    assert "Active transport: gather_broadcast since" in md and "within budget." in md
    # the decisions of the site ledger, oldest first
    decisions = _table_after(md, "Decisions (site ledger)")
    assert decisions[0][:5] == ["time", "user", "action", "verdict", "transport"]
    assert [r[2:5] for r in decisions[1:]][0] == ["promote", "refused", week.promoted]
    assert decisions[2][2] == "promote" and decisions[2][3] in ("promoted", "forced")
    assert decisions[3][2:5] == ["rollback", "rolled_back", "gather_broadcast"] and decisions[3][-1] == "p90 drill"
    assert decisions[1][8] == "NO" and decisions[3][8] == "yes"  # refused on the tight site (1 us budget)
    # before/after of the transport that changed, never gather_broadcast against itself
    head, promote, rollback = _table_after(md, "Before / after: the transport that changed")
    assert head[:3] == ["time", "change", "before"]
    gb, new = bench["transports"]["gather_broadcast"]["refit_s"], bench["transports"][week.promoted]["refit_s"]
    assert promote[2] == "gather_broadcast" and promote[5] == week.promoted and promote[-1] == "bench"
    assert promote[8] == _ratio(new["median"], gb["median"]) and promote[9] == _ratio(new["p90"], gb["p90"])
    back = rb["transports"]["gather_broadcast"]["refit_s"]
    assert rollback[2] == week.promoted and rollback[5] == "gather_broadcast"
    assert rollback[8] == _ratio(back["median"], new["median"]) and rollback[-1] == "bench / rollback-check"
    # the API refits are a source of their own, read from their events
    assert "# Run api-refits" in md and "API refits (Refitter events_dir)" in md
    assert_human(md)
    assert {p.name for p in out.glob("*.png")} == {"latency-over-time.png", "latency.png"} | {
        f"{k}-{i}.png" for k in ("timeline", "bytes") for i in (1, 2, 3)}


def test_without_a_ledger_change_the_runs_active_transports_are_compared_first_to_last(week, tmp_path):
    fresh = site_profile(tmp_path, "fresh", budget_s=0.5, state_dir=tmp_path / "fresh-state")
    out = tmp_path / "rep"
    assert main(["report", str(week.bench), str(week.rollback), "--site", fresh, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "no ledger at" in md and "Decisions" not in md and "the transport that changed" not in md
    head, first, last = _table_after(md, "Before / after: bench -> rollback-check")
    assert head == ["run", "active transport", "median", "p90"]
    assert first[:2] == ["bench", "gather_broadcast"] and last[:2] == ["rollback-check", "gather_broadcast"]
    med = [_summary(d)["transports"]["gather_broadcast"]["refit_s"]["median"] for d in (week.bench, week.rollback)]
    assert f"median {_ratio(med[1], med[0])}" in md
    assert_human(md)


def test_the_slurm_table_shows_human_values(week, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(week.rollback, run)
    summary = _summary(run)
    summary["slurm"] = {"mode": "hetjob", "job_ids": {"het": "41"}, "states": {"41+0": "COMPLETED", "41+1": "FAILED"},
                        "exit_codes": {"41+0": 0, "41+1": 1}, "submitted_at": 1796134121.88,
                        "scripts": ["hetjob.sbatch"], "nodes": {"train": "n1", "infer": "n2"}, "interrupted": False,
                        "queue_s": 2.5, "peak_bytes": 3 << 30}
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    for row in ("| submitted_at | 2026-12-01 14:08:41 UTC |", "| scripts | hetjob.sbatch |",
                "| nodes | train: n1, infer: n2 |", "| interrupted | no |", "| queue_s | 2.500 s |",
                "| peak_bytes | 3.0 GiB |", "| het | 41+1 | FAILED | 1 |"):
        assert row in md, row
    assert_human(md)


def test_a_sites_week_from_its_ledger_lists_runs_gone_and_goes_to_its_own_directory(week, tmp_path, monkeypatch, capsys):
    site = site_profile(tmp_path, "wk", budget_s=60, state_dir=tmp_path / "wk-state")
    gone = str(tmp_path / "deleted-run")
    with ledger.transaction(tmp_path / "wk-state" / "local.ledger.jsonl") as txn:
        for d in (gone, str(week.bench), str(week.rollback)):
            txn.append(ledger.stamped({"site": "local", "action": "measure", "transport": "gather_broadcast",
                                       "run_dir": d, "verdict": "within_budget"}))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["report", "--site", site, "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert files[0] == "reshardctl-report-local/report.md"
    md = (tmp_path / "reshardctl-report-local" / "report.md").read_text()
    assert f"Run directory {gone} (named in the ledger): no longer on disk." in md
    assert md.index("# Run bench") < md.index("# Run rollback-check") and "from 2 run directories" in md


def test_a_site_with_nothing_to_report_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    empty = site_profile(tmp_path, "empty", budget_s=60, state_dir=tmp_path / "empty-state")
    assert main(["report", "--site", empty]) == 2
    err = capsys.readouterr().err
    assert "nothing to report" in err and "no ledger" in err and "Traceback" not in err
    gone = site_profile(tmp_path, "gone", budget_s=60, state_dir=tmp_path / "gone-state")
    with ledger.transaction(tmp_path / "gone-state" / "local.ledger.jsonl") as txn:
        txn.append(ledger.stamped({"site": "local", "action": "measure", "transport": "reshard",
                                   "run_dir": str(tmp_path / "old"), "verdict": "within_budget"}))
    assert main(["report", "--site", gone]) == 2
    err = capsys.readouterr().err
    assert "none of the 1 run directories" in err and str(tmp_path / "old") in err
    assert main(["report"]) == 2  # no run directory, no site given or configured (RESHARDCTL_SITE, config file)
    assert "report without RUN_DIR needs a site" in capsys.readouterr().err
    monkeypatch.setenv("RESHARDCTL_SITE", empty)  # the default site's week: its (empty) ledger
    assert main(["report"]) == 2 and "nothing to report" in capsys.readouterr().err
    assert not (tmp_path / "reshardctl-report-local").exists()


def test_a_corrupt_ledger_is_exit_2_naming_it(week, tmp_path, capsys):
    bad = site_profile(tmp_path, "bad", budget_s=60, state_dir=tmp_path / "bad-state")
    (tmp_path / "bad-state").mkdir()
    (tmp_path / "bad-state" / "local.ledger.jsonl").write_text("not json\n")
    assert main(["report", str(week.bench), "--site", bad, "--out", str(tmp_path / "rep")]) == 2
    assert "local.ledger.jsonl" in capsys.readouterr().err and not (tmp_path / "rep").exists()


def test_one_html_file_embeds_every_plot(week, tmp_path):
    out = tmp_path / "html"
    assert main(["report", str(week.api / "events"), "--format", "html"]) == 0  # default --out: beside events/
    shutil.move(week.api / "report", out)
    assert list(out.iterdir()) == [out / "report.html"]
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "API refits" in page  # over time, latency, timeline, bytes


_values = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12)
                       | st.floats(allow_nan=False, allow_infinity=False, width=32)
                       | st.text(alphabet="abcdefgh -_:", max_size=8),
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(alphabet="abc_", min_size=1, max_size=5), inner, max_size=3),
                       max_leaves=8)


@given(st.sampled_from(["state", "submitted_at", "queue_s", "peak_bytes", "nodes"]), _values)
@example("submitted_at", 6.77680384007209e+16)  # past any calendar date: gmtime overflows
def test_a_human_value_has_no_python_syntax(key, value):
    text = human(key, value)
    assert not re.search(r"[\[\]{}]|True|False|None|'", text), (key, value, text)
    if isinstance(value, bool):
        assert text in ("yes", "no")


def test_a_promote_of_the_already_active_transport_is_not_a_change(week):
    """A site whose profile already says reshard, promoted to reshard: the ledger records the promotion, but
    the active transport did not change, so the page has no reshard -> reshard before/after row (it had:
    1.00x of the same figures)."""
    from dataclasses import replace

    from reshardctl.report.collect import load_run_data
    from reshardctl.report.history import SiteLedger
    from reshardctl.report.page import _changes

    bench = load_run_data(week.bench)
    same = ledger.stamped({"site": "local", "action": "promote", "transport": "reshard", "verdict": "promoted",
                           "run_dir": str(week.bench), "details": {"active_before": "reshard"}})
    assert _changes([bench], SiteLedger("local", 5.0, "reshard", [same])) == []
    changed = replace(same, details={"active_before": "gather_broadcast"})
    head, row = _changes([bench], SiteLedger("local", 5.0, "gather_broadcast", [changed]))[1].rows
    assert row[2] == "gather_broadcast" and row[5] == "reshard"


def test_every_time_of_a_table_is_in_one_unit():
    """The decisions and before/after tables put a median beside a p90 and a budget: one unit for all
    of them (before: 678.67 ms in one column beside 0.679 s in the next)."""
    from reshardctl.report.page import _table

    block = _table(("a", "b", "c"), [["x", 0.6787, 1.024], ["y", 0.0587, None]], (1, 2))
    assert [r[1:] for r in block.rows[1:]] == [("0.679 s", "1.024 s"), ("0.059 s", "-")]


def test_a_time_past_any_calendar_date_is_shown_as_its_number():
    assert utc(6.77680384007209e16) == "6.7768e+16 s (not a date)"
    assert utc(0.0) == "1970-01-01 00:00:00 UTC"
    assert utc(None) == "-"
