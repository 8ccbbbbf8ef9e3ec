"""`reshardctl status` judges the budget as the promotion gate does (runbook/gate.py): the active transport
meets it only when its median AND its p90 are within it, and the table and --json say which figure is over.

The ledger lines are written as `promote` / `rollback --verify` write them (a real file, read by the real
command); the measurements are chosen: a shared machine cannot produce a tail over the budget on demand."""

from __future__ import annotations

import json

import pytest

from reshardctl.cli import main

BUDGET = 5.0  # the shipped local profile's refit.latency_budget_s; its refit.transport is reshard


def _measure(transport: str, median: float, p90: float, verdict: str = "within_budget") -> dict:
    return {"v": 1, "time": "2026-01-01T00:00:00.000Z", "user": "u", "host": "h", "site": "local",
            "action": "measure", "transport": transport, "run_dir": "/runs/bench-1", "plan_fingerprint": None,
            "median_s": median, "p90_s": p90, "budget_s": BUDGET, "verdict": verdict, "reason": None}


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "120")
    path = tmp_path / "state" / "reshardctl" / "local.ledger.jsonl"
    path.parent.mkdir(parents=True)

    def write(*entries: dict) -> None:
        path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return write


def _status(capsys) -> tuple[str, dict]:
    capsys.readouterr()
    assert main(["status", "--site", "local"]) == 0
    text = capsys.readouterr().out
    assert main(["status", "--site", "local", "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def test_a_median_within_and_a_p90_over_the_budget_does_not_meet_it(ledger, capsys):
    # the median-only verdict a ledger may hold says within_budget: status judges today's budget on the tail
    ledger(_measure("reshard", 4.0, 6.0), _measure("gather_broadcast", 7.0, 8.0, "over_budget"))
    text, st = _status(capsys)
    assert st["active"]["transport"] == "reshard"
    assert st["active_meets_budget"] is False
    rs = st["latest_measured"]["reshard"]
    assert rs["within_budget_now"] is False
    assert rs["over_budget_now"] == {"p90": "p90 6.000 s > budget 5.000 s"}
    assert st["latest_measured"]["gather_broadcast"]["over_budget_now"] == {
        "median": "median 7.000 s > budget 5.000 s", "p90": "p90 8.000 s > budget 5.000 s"}
    flat = " ".join(text.split())
    assert ("budget (refit.latency_budget_s): 5.000 s on the median and the p90; active transport meets it: "
            "NO (p90 6.000 s > budget 5.000 s)") in flat, text
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("reshard ", "gather_broadcast "))}
    assert "no (p90)" in rows["reshard"] and "6.000 s" in rows["reshard"], rows
    assert "no (median, p90)" in rows["gather_broadcast"], rows


def test_median_and_p90_within_the_budget_meet_it_quoting_both(ledger, capsys):
    ledger(_measure("reshard", 1.0, 4.5))
    text, st = _status(capsys)
    assert st["active_meets_budget"] is True
    assert st["latest_measured"]["reshard"]["within_budget_now"] is True
    assert st["latest_measured"]["reshard"]["over_budget_now"] == {}
    assert "active transport meets it: yes (median 1.000 s, p90 4.500 s)" in " ".join(text.split()), text


def test_an_unverified_measurement_neither_meets_nor_misses(ledger, capsys):
    ledger(_measure("reshard", 1.0, 2.0, "not_verified"))
    text, st = _status(capsys)
    assert st["active_meets_budget"] is None and st["latest_measured"]["reshard"]["within_budget_now"] is False
    assert "active transport meets it: not measured yet" in " ".join(text.split())
