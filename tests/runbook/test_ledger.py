"""The site ledger: where it lives, strict reading (corrupt / newer / torn lines are errors naming file and
line, never rewritten), the promotion conditions on a real bench run, and racing writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reshardctl.cli import main
from reshardctl.runbook import ledger
from reshardctl.site import load_profile

from helpers.runbook_helpers import ledger_lines, site_profile


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> tuple[str, str]:
    """(model config, run directory) of one real bench (tp=2 -> tp=2, one timed refit per transport)."""
    from helpers.small_llama import SMALL_LLAMA

    d = tmp_path_factory.mktemp("ledger-bench")
    (d / "config.json").write_text(json.dumps(SMALL_LLAMA))
    out = d / "bench"
    assert main(["bench", "--model", str(d / "config.json"), "--train", "tp=2", "--infer", "tp=2", "--iters", "1",
                 "--warmup", "0", "--out", str(out)]) == 0
    return str(d / "config.json"), str(out)


def test_the_state_dir_comes_from_the_profile_else_xdg_else_home(tmp_path, monkeypatch):
    p = load_profile(site_profile(tmp_path, "a", budget_s=1, state_dir=tmp_path / "s"))
    assert ledger.ledger_path(p) == tmp_path / "s" / "local.ledger.jsonl"
    rel = tmp_path / "rel.yaml"
    rel.write_text(Path(site_profile(tmp_path, "b", budget_s=1, state_dir=tmp_path)).read_text()
                   .replace(f"state_dir: {tmp_path}", "state_dir: ledgers"))
    assert ledger.state_dir(load_profile(str(rel))) == tmp_path / "ledgers"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert ledger.ledger_path(load_profile("local")) == tmp_path / "xdg" / "reshardctl" / "local.ledger.jsonl"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ledger.state_dir(load_profile("local")) == tmp_path / "home" / ".local" / "state" / "reshardctl"


def test_a_state_dir_of_the_wrong_type_is_a_profile_error(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text(Path(site_profile(tmp_path, "x", budget_s=1, state_dir=tmp_path)).read_text()
                 .replace(f"state_dir: {tmp_path}", "state_dir: [a, b]"))
    assert main(["profile", "validate", str(f)]) == 2
    assert "`state_dir`" in capsys.readouterr().err


@pytest.mark.parametrize("line, says", [
    ("{not json", "line 2: not valid JSON"),
    ('{"v": 2, "time": "t"}', "line 2: written by a newer reshardctl (ledger version 2"),
    ('{"v": 1, "time": "t"}', "line 2: field `user` is missing"),
    ('[1, 2]', "line 2: expected a JSON object"),
])
def test_a_bad_ledger_line_is_an_error_naming_file_and_line_and_is_never_rewritten(tmp_path, capsys, line, says):
    state = tmp_path / "state"
    site = site_profile(tmp_path, "s", budget_s=1, state_dir=state)
    assert main(["rollback", "--site", site, "--reason", "first"]) == 0  # one good line
    f = state / "local.ledger.jsonl"
    data = f.read_bytes() + line.encode() + b"\n"
    f.write_bytes(data)
    capsys.readouterr()
    for argv in (["status", "--site", site], ["rollback", "--site", site]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert str(f) in err.replace("\n", "") and says in err.replace("\n", " ")
    assert f.read_bytes() == data


def test_a_torn_last_line_is_an_error_too(tmp_path, capsys):
    state = tmp_path / "state"
    site = site_profile(tmp_path, "s", budget_s=1, state_dir=state)
    assert main(["rollback", "--site", site]) == 0
    f = state / "local.ledger.jsonl"
    f.write_bytes(f.read_bytes() + b'{"v": 1, "ti')
    assert main(["status", "--site", site]) == 2
    assert "line 2: incomplete" in capsys.readouterr().err


def test_promote_refuses_runs_of_another_site_model_or_plan_and_force_is_recorded(tmp_path, bench_run, capsys):
    model, run = bench_run
    state = tmp_path / "state"
    roomy = site_profile(tmp_path, "roomy", budget_s=60, state_dir=state)
    other = site_profile(tmp_path, "other", budget_s=60, state_dir=state, site="elsewhere")
    stale = site_profile(tmp_path, "stale", budget_s=60, state_dir=state, bucket_mb=0.01)  # another plan today

    def refused(argv, condition):
        capsys.readouterr()
        assert main(argv) == 1
        err = capsys.readouterr().err.replace("\n", " ")
        assert "refused" in err and f"{condition}:" in err, err
        return err

    err = refused(["promote", "--site", other, "--run", run], "site")
    assert "'local'" in err and "'elsewhere'" in err
    refused(["promote", "--site", roomy, "--run", run, "--model", "tiny-llama"], "model and layouts")
    refused(["promote", "--site", roomy, "--run", run, "--model", model, "--train", "tp=1"], "model and layouts")
    err = refused(["promote", "--site", stale, "--run", run], "plan fingerprint")
    assert "stale" in err
    # --force needs a reason (bad input, nothing recorded), then overrides and is recorded as such
    n = len(ledger_lines(state))
    assert main(["promote", "--site", stale, "--run", run, "--force"]) == 2
    assert len(ledger_lines(state)) == n
    capsys.readouterr()
    assert main(["promote", "--site", stale, "--run", run, "--force", "--reason", "known-good plan change",
                 "--json"]) == 0
    forced = json.loads(capsys.readouterr().out)  # the JSON alone on stdout, the settings inside it
    assert forced["decision"]["verdict"] == "forced" and "refit_transport: nccl_reshard" not in forced["framework_settings"]
    assert "RESHARDCTL_SITE" in forced["framework_settings"] and forced["framework_settings_refused"] is None
    last = ledger_lines(state)[-1]
    assert last["verdict"] == "forced" and last["reason"] == "known-good plan change"
    assert "plan fingerprint" in last["details"]["failed"] and last["details"]["forced"] is True
    # gather_broadcast is not promoted (rollback is), and a directory without summary.json is bad input
    assert main(["promote", "--site", roomy, "--run", run, "--transport", "gather_broadcast"]) == 2
    assert main(["promote", "--site", roomy, "--run", str(tmp_path)]) == 2
    # measured once per run and transport, however many promotes looked at the run
    assert sorted(e["transport"] for e in ledger_lines(state) if e["action"] == "measure") == [
        "gather_broadcast", "hybrid", "reshard"]
    # flags not given are the run's own: --model alone (the run's model) compares the model only
    capsys.readouterr()
    code = main(["promote", "--site", roomy, "--run", run, "--model", model, "--json"])
    out = json.loads(capsys.readouterr().out)  # stdout is the JSON alone, promoted or refused
    assert (code == 0) == (out["decision"]["verdict"] == "promoted") == (out["framework_settings"] is not None)
    checks = {c["name"]: c for c in out["checks"]}
    assert checks["model and layouts"]["ok"] and "as the command line" in checks["model and layouts"]["detail"]


def _waiters(path: Path) -> int:
    """Processes blocked on the ledger's flock (from /proc/locks)."""
    ino = os.stat(path).st_ino
    return sum(1 for line in Path("/proc/locks").read_text().splitlines() if "->" in line and f":{ino} " in line)


def test_two_promotes_and_a_rollback_racing_on_one_ledger_lose_no_entry(tmp_path, bench_run):
    import fcntl

    _, run = bench_run
    state = tmp_path / "state"
    site = site_profile(tmp_path, "race", budget_s=60, state_dir=state)
    f = state / "local.ledger.jsonl"
    state.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmds = [["promote", "--site", site, "--run", run, "--transport", "reshard", "--force", "--reason", "race a"],
            ["promote", "--site", site, "--run", run, "--transport", "hybrid", "--force", "--reason", "race b"],
            ["rollback", "--site", site, "--reason", "race c"]]
    # hold the lock until all three wait on it, so they really contend for it
    with open(f, "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        procs = [subprocess.Popen([sys.executable, "-m", "reshardctl", "-q", *c], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for c in cmds]
        deadline = time.monotonic() + 120
        while _waiters(f) < 3 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.1)
        assert _waiters(f) == 3, [p.poll() for p in procs]
        fcntl.flock(holder, fcntl.LOCK_UN)
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], results
    lines = f.read_text().splitlines()
    entries = [json.loads(x) for x in lines]
    decisions = [e for e in entries if e["action"] != "measure"]
    assert sorted(e["reason"] for e in decisions) == ["race a", "race b", "race c"]
    # each saw the history the previous one wrote: the run's measurements recorded exactly once,
    # and every decision's "active before" is the transport the previous decision left
    assert sorted(e["transport"] for e in entries if e["action"] == "measure") == ["gather_broadcast", "hybrid", "reshard"]
    active = "gather_broadcast"
    for e in decisions:
        assert e["details"]["active_before"] == active
        active = e["transport"]
    assert len(ledger.read_ledger(f)) == len(lines)


def _append_many(path: str, who: int, n: int) -> None:
    for k in range(n):
        with ledger.transaction(Path(path)) as txn:
            txn.append(ledger.stamped(dict(site="local", action="measure", transport="reshard", verdict="within_budget",
                                           reason=f"{who}-{k}", details={"seen": len(txn.entries)})))


def test_many_writers_in_many_processes_lose_nothing(tmp_path):
    import multiprocessing as mp

    f = tmp_path / "local.ledger.jsonl"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(f), w, 15)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    entries = ledger.read_ledger(f)
    assert sorted(e.reason for e in entries) == sorted(f"{w}-{k}" for w in range(3) for k in range(15))
    # under the lock every writer saw all earlier entries: "seen" counts 0, 1, 2, ... in file order
    assert [e.details["seen"] for e in entries] == list(range(45))


def test_write_into_a_missing_directory_is_bad_input_and_records_nothing(tmp_path, capsys):
    state = tmp_path / "state"
    site = site_profile(tmp_path, "w", budget_s=1, state_dir=state)
    assert main(["rollback", "--site", site, "--write", str(tmp_path / "no" / "such.yaml")]) == 2
    assert "--write" in capsys.readouterr().err and ledger_lines(state) == []
    assert main(["rollback", "--site", site, "--dry-run"]) == 0 and ledger_lines(state) == []
