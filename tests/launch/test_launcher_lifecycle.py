"""The launcher's promises about processes and the run directory: a wrong token is refused at
rendezvous, ranks never outlive their launcher (killed outright or stopped by a signal), a run that
cannot fit in memory is refused before any process starts, run directories are private and say who
started them, and a bad drill spec is bad input (exit 2)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from reshardctl.cli import main
from reshardctl.errors import InputError, LaunchError
from reshardctl.launch.ports import free_port
from reshardctl.plan.refit_plan import Plan
from reshardctl.launch.memory_check import check_memory, needed_bytes
from reshardctl.runs.rundir import run_state
from reshardctl.runtime.env import make_rank_env
from reshardctl.runtime.groups import rendezvous

from helpers.runtime_plans import p2p_plan, rows_cols_case


def test_a_rank_with_another_token_is_refused_and_cannot_touch_the_run():
    port = free_port()
    host = make_rank_env(0, 1, 2, "127.0.0.1", port)
    run = rendezvous(host, 10, token="the-run")
    run.set("mine", "1")
    with pytest.raises(LaunchError, match="refused at rendezvous"):
        rendezvous(make_rank_env(1, 1, 2, "127.0.0.1", port), 10, token="a-stale-rank")
    with pytest.raises(LaunchError, match="refused at rendezvous"):
        rendezvous(make_rank_env(2, 1, 2, "127.0.0.1", port), 10, token=None)
    ok = rendezvous(make_rank_env(1, 1, 2, "127.0.0.1", port), 10, token="the-run")
    assert ok.get("mine") == b"1"  # the same run's namespace


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid``: spawned ranks are the launcher's children, forked ones the fork
    server's (which is the launcher's child); either way nothing of the run may outlive it."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = [int(x) for x in out.split()]
    return kids + [g for k in kids for g in _children(k)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.fixture
def short_tmpdir():
    """The launcher's private $TMPDIR, on a short path: the fork server's socket is made in it and an AF_UNIX
    path has at most 107 bytes (under tmp_path, .../pytest-NNN/popen-gwN/test_.../tmpdir/pymp-*/listener-*,
    the launcher failed with "AF_UNIX path too long" in a pytest-xdist worker)."""
    d = Path(tempfile.mkdtemp(prefix="ll-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _start_run(tmpdir, small_llama, out):
    # a rank that hangs keeps the run going until the launcher is stopped
    cmd = [sys.executable, "-m", "reshardctl.cli", "run", "--model", small_llama, "--train", "tp=2",
           "--infer", "tp=2", "--iters", "3", "--out", str(out), "--timeout-s", "600",
           "--inject", "hang:rank=1:phase=start:step=2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ranks: list[int] = []
    for _ in range(600):  # until the four ranks exist and the hang started (a drill event)
        ranks = [p for p in _children(proc.pid) if _alive(p)]
        drills = list((out / "events").glob("rank-1.jsonl"))
        if len(ranks) >= 4 and drills and '"drill"' in drills[0].read_text():
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    assert len(ranks) >= 4
    return proc, ranks


def _wait_gone(pids: list[int], tries: int = 120) -> list[int]:
    for _ in range(tries):
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.25)
    return [p for p in pids if _alive(p)]


def test_ranks_stop_when_their_launcher_is_killed(tmp_path, short_tmpdir, small_llama, capsys):
    out = tmp_path / "run"
    proc, ranks = _start_run(short_tmpdir, small_llama, out)
    proc.kill()  # SIGKILL: the launcher cannot clean up
    proc.wait()
    assert _wait_gone(ranks) == []
    assert run_state(out) == "interrupted"
    assert not (out / "summary.json").exists()
    # nothing of the run in $TMPDIR (the ranks' plans file is in the run directory, 0600, without the token);
    # what a launcher killed outright leaves there is multiprocessing's own private directory of the fork
    # server's socket (Python removes it at a normal exit)
    for d in short_tmpdir.iterdir():
        assert d.name.startswith("pymp-") and d.is_dir() and d.stat().st_mode & 0o777 == 0o700, d
        assert all(f.name.startswith("listener-") and f.is_socket() for f in d.iterdir()), list(d.iterdir())
    (left,) = out.glob(".ranks-*.pickle")
    assert left.stat().st_mode & 0o777 == 0o600
    # the Slurm launcher's session file format: the planner's own plans (each rank derives its steps)
    spec = pickle.loads(left.read_bytes())
    assert set(spec) == {"plans", "options", "warmup", "fallback"}
    assert len(spec["plans"]) == 1 and all(type(p) is Plan for p in spec["plans"].values())
    options = spec["options"]
    assert options.run_dir == str(out) and options.token is None  # the token reached the ranks by pipe only
    assert json.loads((out / "run.json").read_text())["state"] == "running"
    # `reshardctl collect` settles it: run.json's final state, the leftover file gone
    assert main(["collect", str(out)]) == 1
    assert "launcher ended without a summary" in capsys.readouterr().err
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "interrupted" and run["settled"]["from"] == "running"
    assert list(out.glob(".ranks-*.pickle")) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_stops_the_ranks_and_writes_an_interrupted_summary(tmp_path, short_tmpdir, small_llama, sig):
    out = tmp_path / "run"
    proc, ranks = _start_run(short_tmpdir, small_llama, out)
    proc.send_signal(sig)
    _, err = proc.communicate()
    assert proc.returncode == 130, err  # as an interrupted Slurm run (the CLI's Interrupted code)
    assert f"interrupted by {sig.name}: stopped the 4 rank process(es)" in err.decode(), err
    assert _wait_gone(ranks) == []
    s = json.loads((out / "summary.json").read_text())
    assert s["interrupted"] is True and s["ok"] is False
    assert run_state(out) == "interrupted"
    assert "Traceback" not in err.decode()


def test_a_run_that_cannot_fit_is_refused_before_any_process(tmp_path, small_llama, monkeypatch, capsys):
    import reshardctl.launch.memory_check as mc

    monkeypatch.setattr(mc, "available_bytes", lambda meminfo="/proc/meminfo": 512 << 20)
    out = tmp_path / "run"
    code = main(["run", "--model", small_llama, "--train", "tp=2", "--infer", "tp=2", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "need about" in err and "4 processes x" in err and "nothing was started" in err
    assert not out.exists()


def test_memory_arithmetic():
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst)
    need = needed_bytes(plan)
    weights = sum(t.nbytes for t in m.tensors)
    assert need["trainer_weights"] >= weights and need["inference_staging"] == need["inference_weights"]
    assert need["total"] == (need["trainer_weights"] + 2 * need["inference_weights"] + need["pools"]
                             + need["processes"])
    with pytest.raises(InputError, match="nothing was started"):
        check_memory({"p": plan}, available=need["total"])  # the 10 % reserve does not fit
    assert check_memory({"p": plan}, available=2 * need["total"]) == need


def test_run_directory_is_private_and_records_who_started_it(tmp_path, small_llama, capsys):
    out = tmp_path / "run"
    assert main(["run", "--model", small_llama, "--train", "tp=2", "--infer", "tp=2", "--iters", "1",
                 "--warmup", "0", "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["started_by"]["user"] and s["started_by"]["pid"] == os.getpid()
    assert (out.stat().st_mode & 0o777) == 0o700
    for f in out.rglob("*"):
        assert (f.stat().st_mode & 0o777) == (0o700 if f.is_dir() else 0o600), f
    assert run_state(out) == "finished"
    assert s["transports"]["reshard"]["committed_steps_agree"] is True


@pytest.mark.parametrize("spec,msg", [
    ("explode:rank=1", "unknown drill"), ("kill:phase=transfer", "rank=<global rank> is required"),
    ("hang:rank=1:phase=later", "phase 'later'"), ("kill:rank=9", "outside the run's 4 ranks"),
    ("slow:rank=1:factor=x", "numbers"),
])
def test_bad_drills_are_bad_input(tmp_path, small_llama, capsys, spec, msg):
    out = tmp_path / "run"
    code = main(["run", "--model", small_llama, "--train", "tp=2", "--infer", "tp=2", "--out", str(out),
                 "--inject", spec])
    assert code == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()


def test_gpu_memory_is_checked_per_rank():
    from reshardctl.launch.memory_check import check_gpu_memory, rank_bytes

    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst)
    check_gpu_memory({"p": plan}, lambda r: 10 * rank_bytes(plan, r))
    with pytest.raises(InputError, match="rank 3: .* free on cuda:3"):
        check_gpu_memory({"p": plan}, lambda r: 10 * rank_bytes(plan, r) if r != 3 else rank_bytes(plan, r))


_FROM_STDIN = """
import sys
import tempfile
from reshardctl.launch import local
from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import prepare
from reshardctl.runs.session import run_refit_session
if sys.argv[1] == "unchecked":  # as before the check: the ranks are spawned and die re-importing '<stdin>'
    local.check_main_importable = lambda: None
inp = prepare(RefitRequest(model="tiny-qwen3-moe", train="ep=4", infer="tp=4", transport="reshard"))
res = run_refit_session(inp, ["reshard"], iterations=1, warmup=0, out=None)
print("RESULT:", res.ok, res.error)
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("mode", ["checked", "unchecked"])
def test_a_program_read_from_stdin_gets_an_answer_not_a_hang(mode, method):
    """Ranks re-import the main module by path (spawned ones, and those forked from the fork server
    alike), which a program read from standard input has not: the launcher says so before starting
    anything; and were it to start them, every rank dies at once and the run ends failed. (A MoE plan's
    pickle is larger than a pipe's buffer: sent through spawn's pipe, the launcher blocked for ever
    writing it to a rank that had died.) The subprocess timeout only catches a hang."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "RESHARDCTL_START_METHOD": method}
    proc = subprocess.run([sys.executable, "-", mode], input=_FROM_STDIN, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT: False" in proc.stdout, proc.stdout[-3000:]
    if mode == "checked":  # refused with the reason, before any rank started
        assert "'<stdin>'" in proc.stdout and "script file" in proc.stdout and "without a report" not in proc.stdout
    else:
        assert "RESULT: False" in proc.stdout and "without a report" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_failed_start_kills_the_ranks_already_started_and_leaves_no_plan_file(monkeypatch, tmp_path, method):
    """When starting the third rank fails, the launcher raises that error, the two ranks already
    started (and running: rank 0 hosts the store and waits for the others) are not left running, and
    the private file the plans went through is gone."""
    import tempfile

    import torch.multiprocessing as tmp_mp

    from reshardctl.launch import local
    from reshardctl.runtime.contract import RunOptions

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the launcher's scratch directory goes here
    monkeypatch.setenv("RESHARDCTL_START_METHOD", method)
    cls = tmp_mp.get_context(method).Process
    real_start = cls.start
    started = []

    def start(self):
        if len(started) == 2:
            time.sleep(5)  # the two started ranks are past their start-up (they would outlive a launcher that left them)
            raise OSError("no more processes")
        real_start(self)
        started.append(self.pid)

    monkeypatch.setattr(cls, "start", start)
    m, src, dst = rows_cols_case()
    with pytest.raises(OSError, match="no more processes"):
        local.launch_local_ranks({"a": p2p_plan(m, src, dst)}, RunOptions())
    assert len(started) == 2
    assert _wait_gone(started) == []
    assert not list(tmp_path.glob("reshardctl-ranks-*"))


def test_a_rank_waiting_for_reports_knows_at_once_that_a_rank_ended(tmp_path):
    """Slurm ranks wait for each other's reports after their own (runtime/report_wait.py): a rank whose
    task wrote logs/rank-N.exit (killed, exited) is not waited for; a silent one is given up 2 s after
    the last news once a failure is known, not after the timeout."""
    from reshardctl.runtime.report_wait import await_reports

    (tmp_path / "reports").mkdir()
    (tmp_path / "logs").mkdir()
    for r in (0, 1, 2):
        (tmp_path / "reports" / f"rank-{r}.json").write_text("{}")
    t = time.monotonic()
    assert await_reports(tmp_path, 4, failed=True, timeout_s=60) == "quiet"
    assert 2.0 <= time.monotonic() - t < 4.0
    (tmp_path / "logs" / "rank-3.exit").write_text("137\n")
    t = time.monotonic()
    assert await_reports(tmp_path, 4, failed=False, timeout_s=60) == "all"
    assert time.monotonic() - t < 0.5
    (tmp_path / "logs" / "rank-3.exit").unlink()
    assert await_reports(tmp_path, 4, failed=False, timeout_s=0.1) == "backstop"  # no failure: not quiet
