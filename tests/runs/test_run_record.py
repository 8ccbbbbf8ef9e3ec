"""The run record a runbook can trust: record.json (versions, hosts, UTC start, profile hash, timeouts),
phases that add up per rank, the slowest rank per phase, and --out refusing an old run unless --force."""

from __future__ import annotations

import json
import re

import pytest

from reshardctl.cli import main
from reshardctl.runs.record import profile_sha256
from reshardctl.runs.rundir import check_out_dir
from reshardctl.errors import InputError


@pytest.fixture
def small(small_llama) -> str:
    return small_llama


def _run(small, out, *extra):
    return main(["run", "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "2",
                 "--transport", "reshard", "--timeout-s", "40", "--out", str(out), "--json", *extra])


def test_run_record_and_phases(tmp_path, small, capsys):
    import socket

    import torch

    import reshardctl
    from reshardctl.site import load_profile
    from reshardctl.site.spec import profile_to_dict

    out = tmp_path / "run"
    assert _run(small, out) == 0
    summary = json.loads(capsys.readouterr().out)
    rec = json.loads((out / "record.json").read_text())
    assert summary["record"] == rec
    assert summary["run_dir"] == str(out.resolve())
    assert rec["reshardctl_version"] == reshardctl.__version__ and rec["torch_version"] == str(torch.__version__)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rec["started_at_utc"])
    assert rec["hosts"] == {str(r): socket.gethostname() for r in range(4)}
    assert rec["backend"] in ("gloo", "nccl")
    assert rec["timeouts"]["timeout_s"] == 40 and summary["timeout_s"] == 40
    assert rec["timeouts"]["rendezvous_timeout_s"] > 0
    prof = profile_to_dict(load_profile(rec["site"]))
    assert rec["site_profile_sha256"] == profile_sha256(prof) and len(rec["site_profile_sha256"]) == 64
    assert {k: v for k, v in rec["site_profile"].items() if k != "source"} == \
        {k: v for k, v in json.loads(json.dumps(prof)).items() if k != "source"}

    events = [json.loads(line) for f in (out / "events").glob("rank-*.jsonl") for line in f.read_text().splitlines()]
    commits = [e for e in events if e["phase"] == "commit"]
    assert len(commits) == 4 * 3 and all(e["transport"] == "reshard" for e in commits)
    assert sum(bool(e.get("warmup")) for e in commits) == 4  # --warmup 1: one warm-up refit per rank, marked
    assert all(e["transport"] == "reshard" for e in events if e["phase"] in ("verify", "round/transfer", "attempt"))
    assert all(e["step"] == 1 for e in events if e.get("warmup") and "step" in e)  # the warm-up is step 1
    assert all("transport" not in e for e in events if e["phase"] == "agreement")

    s = summary["transports"]["reshard"]
    for ph in ("refit_s", "transfer_s", "verify_s", "commit_s"):
        assert set(s[ph]) >= {"median", "p90", "min", "all", "slowest_rank"}, ph
        assert len(s[ph]["all"]) == 2 and len(s[ph]["slowest_rank"]) == 2
    per_rank = s["per_rank"]
    assert set(per_rank) == {"0", "1", "2", "3"}
    for k in range(2):
        for r, p in per_rank.items():  # a rank's phases add up to its refit time
            assert p["refit_s"][k] == pytest.approx(p["transfer_s"][k] + p["verify_s"][k] + p["commit_s"][k],
                                                    rel=1e-12, abs=1e-12)
        for ph in ("refit_s", "transfer_s", "verify_s", "commit_s"):  # the slowest rank, named
            slow = s[ph]["slowest_rank"][k]
            assert s[ph]["all"][k] == max(p[ph][k] for p in per_rank.values()) == per_rank[str(slow)][ph][k]


def test_out_refuses_a_non_empty_directory_unless_force(tmp_path, small, capsys):
    out = tmp_path / "old"
    out.mkdir()
    (out / "plan-hybrid.npz").write_text("stale")
    (out / "events").mkdir()
    (out / "events" / "rank-9.jsonl").write_text("{}\n")
    code = _run(small, out)
    assert code == 2
    io = capsys.readouterr()
    err = io.out + io.err  # --json: the error is the JSON object on stdout
    assert str(out) in err and "not empty" in err and "--force" in err and "Traceback" not in err
    assert sorted(p.name for p in out.rglob("*")) == ["events", "plan-hybrid.npz", "rank-9.jsonl"]  # untouched

    assert _run(small, out, "--force") == 0
    capsys.readouterr()
    assert not (out / "plan-hybrid.npz").exists() and not (out / "events" / "rank-9.jsonl").exists()
    assert (out / "summary.json").is_file() and (out / "plan-reshard.npz").is_file()
    assert len(list((out / "events").glob("rank-*.jsonl"))) == 4


def test_out_checks_without_running(tmp_path, monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        check_out_dir(f)
    check_out_dir(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    check_out_dir(empty)
    monkeypatch.chdir(empty)
    (empty / "x").write_text("x")
    with pytest.raises(InputError, match="will not empty"):  # --force never empties the working directory
        check_out_dir(".", force=True)
    with pytest.raises(InputError, match="will not empty"):
        check_out_dir(str(tmp_path), force=True)
    assert (empty / "x").exists()


def test_bench_refuses_a_non_empty_out(tmp_path, small, capsys):
    out = tmp_path / "b"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    code = main(["bench", "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "1", "--out", str(out)])
    assert code == 2 and "not empty" in capsys.readouterr().err
    assert (out / "summary.json").read_text() == "{}"
