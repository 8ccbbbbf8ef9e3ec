"""LedgerTransport: the site's active transport before each refit of a running job. A stat per call and a
read only when the ledger changed; promote / rollback appended by the real CLI in between are seen at the
next call; a corrupt, vanished or unreadable ledger keeps the last good decision, warned once; a first
read that fails falls back to the profile's transport."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.cli import main
from reshardctl.errors import ProfileError
from reshardctl.runbook import ledger
from reshardctl.runbook.ledger import stamped
from reshardctl.runbook.transport_source import Decision, LedgerTransport

from helpers.runbook_helpers import ledger_lines, site_profile


@pytest.fixture
def site(tmp_path) -> tuple[str, Path]:
    state = tmp_path / "state"
    return site_profile(tmp_path, "s", budget_s=60, state_dir=state), state / "local.ledger.jsonl"


def _source(site: str) -> tuple[LedgerTransport, list[str]]:
    said: list[str] = []
    return LedgerTransport(site, warn=said.append), said


def _append(path: Path, action: str, transport: str, verdict: str) -> None:
    """An entry appended as promote / rollback append theirs (the ledger's own transaction)."""
    with ledger.transaction(path) as txn:
        txn.append(stamped(dict(site="local", action=action, transport=transport, verdict=verdict)))


def _count_reads(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = ledger.read_ledger

    def counting(path):
        calls.append(1)
        return real(path)

    monkeypatch.setattr(ledger, "read_ledger", counting)
    return calls


def test_no_ledger_yet_is_the_profiles_transport_without_a_note(site):
    src, said = _source(site[0])
    assert src() == Decision("gather_broadcast", None, None)
    assert src().decided_by == "profile" and said == [] and src.reads == 0


def test_an_unchanged_ledger_is_stat_only_and_each_change_is_read_once(site, monkeypatch):
    path = site[1]
    _append(path, "promote", "reshard", "promoted")
    reads = _count_reads(monkeypatch)
    src, said = _source(site[0])
    first = src()
    assert first.transport == "reshard" and first.ledger_entry["line"] == 1 and len(reads) == 1
    for _ in range(50):
        assert src() is first  # the cached decision: no read
    assert len(reads) == 1
    _append(path, "measure", "hybrid", "within_budget")  # a change that changes nothing active: read once
    assert src().transport == "reshard" and len(reads) == 2
    assert src().transport == "reshard" and len(reads) == 2
    _append(path, "rollback", "gather_broadcast", "rolled_back")
    d = src()
    assert (d.transport, d.ledger_entry["line"], d.ledger_entry["action"]) == ("gather_broadcast", 3, "rollback")
    assert len(reads) == 3 and said == []


def test_promote_and_rollback_from_the_real_cli_are_picked_up_at_the_next_call(site, capsys):
    prof, path = site
    src, said = _source(prof)
    assert src().transport == "gather_broadcast"
    assert main(["rollback", "--site", prof, "--reason", "drill"]) == 0
    d = src()
    e = ledger_lines(path.parent)[-1]
    assert d.transport == "gather_broadcast" and d.decided_by == "ledger"
    assert d.ledger_entry == {"line": 1, "action": "rollback", "time": e["time"], "user": e["user"],
                              "transport": "gather_broadcast"}
    # a forced promotion (no run proves reshard here: --force with a recorded reason) is a change too
    run = _fake_run(path.parent.parent)
    assert main(["promote", "--site", prof, "--run", str(run), "--transport", "reshard", "--force",
                 "--reason", "test"]) == 0
    d = src()
    assert d.transport == "reshard" and d.ledger_entry["action"] == "promote"
    assert d.ledger_entry["line"] == len(ledger_lines(path.parent)) and said == []
    capsys.readouterr()


def _fake_run(tmp: Path) -> Path:
    """A minimal bench run directory promote can read (the conditions fail: it is promoted with --force)."""
    from reshardctl.request.request import RefitRequest, RunSettings

    d = tmp / "run"
    d.mkdir()
    fig = {"median": 0.5, "p90": 0.5, "min": 0.5, "all": [0.5]}
    summary = {"run_dir": str(d), "command": "reshardctl bench", "ok": True,
               "inputs": {"site": "local", "model": "tiny-llama", "train": "x", "infer": "y"},
               "request": RefitRequest(run=RunSettings(transports=("reshard",))).to_json(),
               "transports": {"reshard": {"fingerprint": "f", "iterations": 1, "verified": True, "failures": [],
                                          "refit_s": fig}}}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_a_corrupt_line_appended_mid_loop_keeps_the_last_good_decision_warned_once(site):
    prof, path = site
    _append(path, "promote", "reshard", "promoted")
    src, said = _source(prof)
    good = src()
    with open(path, "a") as f:
        f.write('{"v": 1, "half a line\n')
    notes = [src() for _ in range(5)]
    assert all(n.transport == "reshard" and n.ledger_entry == good.ledger_entry for n in notes)
    assert all("line 2" in n.note and "keeping the last good decision" in n.note for n in notes)
    assert len(said) == 1 and "line 2" in said[0] and str(path) in said[0]
    with open(path, "a") as f:  # the ledger changed again (still corrupt): read again, the same problem
        f.write("{}\n")
    assert src().transport == "reshard" and len(said) == 1


def test_a_ledger_that_disappears_or_cannot_be_read_keeps_the_last_good_decision(site):
    prof, path = site
    _append(path, "rollback", "gather_broadcast", "rolled_back")
    _append(path, "promote", "hybrid", "promoted")
    src, said = _source(prof)
    good = src()
    assert good.transport == "hybrid" and good.note is None
    os.rename(path, path.with_suffix(".aside"))
    d = src()
    assert (d.transport, d.ledger_entry) == ("hybrid", good.ledger_entry) and "disappeared" in d.note
    path.mkdir()  # a directory where the ledger was: open_regular refuses it (root reads any plain file)
    d = src()
    assert d.transport == "hybrid" and "cannot be read" in d.note and str(path) in d.note
    assert len(said) == 2
    path.rmdir()
    os.rename(path.with_suffix(".aside"), path)  # back: read again, no note
    _append(path, "rollback", "gather_broadcast", "rolled_back")
    d = src()
    assert d.transport == "gather_broadcast" and d.note is None and d.ledger_entry["line"] == 3


def test_a_first_read_that_fails_falls_back_to_the_profiles_transport_with_the_note(site):
    prof, path = site
    path.parent.mkdir(parents=True)
    path.write_text('{"v": 99}\n')  # a newer ledger version
    src, said = _source(prof)
    d = src()
    assert d.transport == "gather_broadcast" and d.ledger_entry is None
    assert "newer" in d.note and "using the profile's refit.transport" in d.note and len(said) == 1
    assert src() is d and len(said) == 1


def test_a_profile_that_cannot_be_loaded_is_refused_at_construction(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("site: [\n")
    with pytest.raises(ProfileError):
        LedgerTransport(str(bad))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([("promote", "reshard", "promoted"), ("promote", "hybrid", "refused"),
                                 ("promote", "hybrid", "forced"), ("rollback", "gather_broadcast", "rolled_back"),
                                 ("rollback", "gather_broadcast", "verify_failed"),
                                 ("measure", "reshard", "within_budget")]), max_size=8))
def test_every_prefix_of_a_history_decides_what_the_ledger_says(tmp_path_factory, history):
    """After each append the callable's decision is ledger.active of the history so far, and the entry
    it names is the line of the last change that took effect."""
    tmp = tmp_path_factory.mktemp("prop")
    prof = site_profile(tmp, "p", budget_s=60, state_dir=tmp / "state")
    path = tmp / "state" / "local.ledger.jsonl"
    src = LedgerTransport(prof, warn=lambda s: pytest.fail(s))
    for i, (action, transport, verdict) in enumerate(history, start=1):
        _append(path, action, transport, verdict)
        d = src()
        changes = [(n, t) for n, (a, t, v) in enumerate(history[:i], start=1)
                   if (a, v) in (("promote", "promoted"), ("promote", "forced"), ("rollback", "rolled_back"))]
        want = changes[-1] if changes else (None, "gather_broadcast")
        assert (d.ledger_entry and d.ledger_entry["line"], d.transport) == want
