"""runs/records.py, the one owner of a run directory's session.json, summary.json and event logs, and
the FailureRecord every launcher builds: a tampered, truncated or newer record is an InputError naming
the file and the key (never a traceback, never a hang on a FIFO or /dev/zero); a line that is not an
event is skipped by the tolerant readers. (The same cases through the real commands:
tests/test_hostile_inputs_2.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reshardctl.bounded_load import LoadError
from reshardctl.commands.selftest_refit import run_outcome
from reshardctl.errors import InputError
from reshardctl.launch.failures import failure_line, knock_on_text, lost_record
from reshardctl.runs.failures import failure_summary
from reshardctl.runs.records import (SESSION_FORMAT, commits_by_side, last_event, parse_event, read_events,
                                     read_events_tolerant, read_session, read_summary, write_session,
                                     write_summary_json)
from reshardctl.runtime.failure_record import FailureRecord

DEEP = '{"phase":"group_init","start":1.0,"duration_s":1.0,"x":' + "[" * 100_000  # json.loads: RecursionError
OLD_LOST_KEYS = {"rank", "host", "side", "side_rank", "phase", "step", "round", "drill", "peers", "at", "knock_on",
                 "error", "message"}
OLD_RANK_KEYS = {"rank", "host", "side", "side_rank", "phase", "step", "round", "step_kind", "peers", "at", "knock_on"}


def _session(**over) -> dict:
    return {"format": SESSION_FORMAT, "run_dir": "/r", "command": "reshardctl run", "world": 4,
            "transports": {"reshard": {"bytes_needed": 1}}, "request": {"format": "reshardctl-request/1"}, **over}


def _summary(**over) -> dict:
    return {"command": "reshardctl bench", "ok": True, "inputs": {"model": "tiny-llama"},
            "request": {"format": "reshardctl-request/1", "model": "tiny-llama"},
            "transports": {"reshard": {"verified": True, "iterations": 1, "failures": [],
                                       "refit_s": {"median": 0.5, "all": [0.5]}}}, **over}


def test_session_and_summary_round_trip_with_the_request_carried_opaque(tmp_path):
    write_session(tmp_path, _session())
    s = read_session(tmp_path)
    assert s.world == 4 and s.transports == ["reshard"] and s.request == {"format": "reshardctl-request/1"}
    assert s.context == json.loads((tmp_path / "session.json").read_text())  # the JSON shape as written
    write_summary_json(tmp_path, _summary())
    r = read_summary(tmp_path)
    assert r.request["model"] == "tiny-llama" and r.verified("reshard") and r.figure("reshard") == 0.5


@pytest.mark.parametrize("over, needle", [
    ({"format": "reshardctl-session/2"}, "`format` is 'reshardctl-session/2'; this reshardctl reads "
                                         "'reshardctl-session/1'"),
    ({"request": "tiny-llama"}, "`request` must be a JSON object (the refit request) or null, got 'tiny-llama'"),
    ({"started_by": [1]}, "`started_by` must be a JSON object"),
    ({"world": True}, "`world` must be a number of ranks"),
    ({"transports": {"reshard": 3}}, "`transports` must map each transport to a JSON object"),
], ids=["newer-format", "request-str", "started_by-list", "world-bool", "transport-int"])
def test_a_tampered_or_newer_session_is_refused_naming_file_and_key(tmp_path, over, needle):
    (tmp_path / "session.json").write_text(json.dumps(_session(**over)))
    with pytest.raises(InputError) as e:
        read_session(tmp_path)
    assert str(tmp_path / "session.json") in e.value.message and needle in e.value.message, e.value.message


@pytest.mark.parametrize("over, needle", [
    ({"format": "reshardctl-summary/2"}, "`format` is 'reshardctl-summary/2'"),
    ({"request": ["x"]}, "`request` must be a JSON object (or null)"),
], ids=["newer-format", "request-list"])
def test_a_newer_or_tampered_summary_is_refused_naming_file_and_key(tmp_path, over, needle):
    (tmp_path / "summary.json").write_text(json.dumps(_summary(**over)))
    with pytest.raises(InputError) as e:
        read_summary(tmp_path, flag="report")
    assert f"report {tmp_path}: summary.json" in e.value.message and needle in e.value.message, e.value.message


@pytest.mark.parametrize("kind", ["truncated", "fifo", "dev-zero", "list"])
def test_an_unreadable_session_json_is_refused_before_reading_it(tmp_path, kind):
    f = tmp_path / "session.json"
    if kind == "truncated":
        f.write_text(json.dumps(_session())[:-7])
    elif kind == "fifo":
        os.mkfifo(f)  # a plain open() would block here for ever
    elif kind == "dev-zero":
        f.symlink_to("/dev/zero")
    else:
        f.write_text("[1, 2]")
    want = {"truncated": "cannot be read", "fifo": "is a FIFO (named pipe), not a file",
            "dev-zero": "is a character device, not a file", "list": "expected a JSON object, got list"}[kind]
    with pytest.raises(InputError) as e:
        read_session(tmp_path)
    assert str(f) in e.value.message and want in e.value.message, e.value.message


def test_one_event_parser_bounded_and_tolerant(tmp_path):
    assert parse_event('{"phase":"commit","rank":1}') == {"phase": "commit", "rank": 1}
    for bad in ('{"phase":"commit","ra', "[1, 2]", DEEP, '{"n":' + "9" * 100 + "}", ""):
        assert parse_event(bad) is None  # never a RecursionError, never a 100-digit number built
    f = tmp_path / "events" / "rank-0.jsonl"
    f.parent.mkdir()
    good = [{"phase": "commit", "rank": 0, "side": "train", "committed": True},
            {"phase": "commit", "rank": 0, "side": "infer", "committed": True}]
    f.write_text("\n".join([json.dumps(good[0]), DEEP, json.dumps(good[1]), '{"phase":"comm']) + "\n")
    assert read_events_tolerant(f) == (good, 2)
    with pytest.raises(LoadError, match="line 2 is not a JSON object"):
        read_events(f)  # the strict reader (tests, a rank's own log) says which line
    assert commits_by_side(f.parent) == {"train": 1, "infer": 1}  # by the parsed event, not by substring
    assert last_event(tmp_path, 0) == good[1] and last_event(tmp_path, 5) == {}


def test_failure_records_keep_their_wire_form_and_read_back_tolerantly(tmp_path):
    lost = lost_record(3, "infer", 1, "h", 12.5, "left no report", tmp_path)
    assert set(lost) >= OLD_LOST_KEYS and lost["error"] == "RankLost" and lost["phase"] is None
    assert set(FailureRecord(rank=2).to_json()) >= OLD_RANK_KEYS
    rec = FailureRecord.from_json({"rank": "2", "side": "train", "step": 1.5, "at": "x", "knock_on": "yes",
                                   "peers": 7, "error": "TransferError", "message": "m"})
    assert rec == FailureRecord(rank=None, side="train", error="TransferError", message="m")
    rows = [lost, {**FailureRecord(rank=0, side="train", side_rank=0, phase="transfer", at=13.0, knock_on=True,
                                   error="Abandoned", message="peer").to_json()}]
    assert failure_line(rows[0]) == "rank 3 (infer 1, h): RankLost: left no report"
    assert knock_on_text(rows[1:]) == "1 other rank stopped because of it: rank 0 Abandoned in transfer"
    fs = failure_summary(rows, [{"fired": True, "at": 12.0}], 5.0)
    assert fs["root_cause"]["rank"] == 3 and fs["failures"][1]["detected_after_s"] == 1.0
    assert "detected_after_s" not in fs["failures"][0]  # a lost rank has no detection time


def test_selftest_reads_its_run_through_the_records(tmp_path):
    """The NCCL check's reading of its run (summary.json, record backend, committed events): a truncated
    events line is skipped, not a failed check (it used ``json.loads`` on every line holding "commit")."""
    rec = {**_summary(), "record": {"backend": "nccl"}}
    write_summary_json(tmp_path, rec)
    ev = tmp_path / "events"
    ev.mkdir()
    (ev / "rank-0.jsonl").write_text(json.dumps({"phase": "commit", "committed": True}) + '\n{"phase":"commit",\n')
    (ev / "rank-1.jsonl").write_text(json.dumps({"phase": "commit", "committed": False, "note": "commit"}) + "\n")
    assert run_outcome(tmp_path) == {"verified": True, "backend": "nccl", "ranks": 2, "commits": 1}
    (tmp_path / "summary.json").write_text(json.dumps({**rec, "ok": False}))
    assert run_outcome(tmp_path)["verified"] is False
    (tmp_path / "summary.json").unlink()
    assert run_outcome(Path(tmp_path)) == {"verified": False, "backend": None, "ranks": 2, "commits": 1}
