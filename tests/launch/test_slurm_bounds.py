"""On a real Slurm cluster: a failure ends the job within the run's `--timeout-s` plus a few seconds
(not the profile's timeout), a lost rank costs no extra timeout, SIGTERM/SIGHUP to `reshardctl run`
cancel the job like Ctrl-C, and a run whose launcher was killed outright is settled by `reshardctl jobs`.

The shipped `slurm-local` profile says `refit.timeout_s: 120`; the runs here say `--timeout-s 6` (or 30):
the bounds asserted are the run's. The job's end is accounting's (`sacct`, whole seconds).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reshardctl.cli import main

from helpers.slurm_cluster import read_summary, wait_for

pytestmark = pytest.mark.usefixtures("slurm_state")

LAYOUT = ["--train", "tp=2", "--infer", "tp=2"]

TIMEOUT = 6  # as the Slurm commit drill (test_commit_protocol.py): a hang or a stop costs this, so keep it short
SITE = "slurm-local"  # refit.timeout_s: 120 (the old srun --wait: 180 s)


def _job(run_dir: Path) -> str:
    return json.loads((run_dir / "slurm" / "jobs.json").read_text())["job_ids"]["het"]


def _job_end(job: str) -> float:
    """When accounting says the job (every component, every step) ended, unix time."""
    ends = []

    def ended() -> bool:
        out = subprocess.run(["sacct", "-n", "-P", "-j", job, "--format=JobID,State,End"], capture_output=True,
                             text=True).stdout
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        if not rows or any(r[2] in ("Unknown", "") for r in rows):
            return False
        ends[:] = [dt.datetime.fromisoformat(r[2]).timestamp() for r in rows]
        return True

    wait_for(ended, 60, f"sacct to record the end of job {job}")
    return max(ends)


def _drill_at(run_dir: Path) -> float:
    for f in (run_dir / "events").glob("rank-*.jsonl"):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e.get("phase") == "drill":
                return e["start"]
    raise AssertionError("no drill event")


def _committed(run_dir: Path) -> bool:
    return any('"phase":"commit"' in f.read_text() for f in (run_dir / "events").glob("rank-*.jsonl")) \
        if (run_dir / "events").is_dir() else False


def _start(tmp_path, out: Path, model: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    return subprocess.Popen(
        [sys.executable, "-m", "reshardctl", "run", "--site", SITE, "--model", model, *LAYOUT, "--out", str(out),
         *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _rank_pid(run_dir: Path, rank: int) -> int:
    """The rank's Python process (not the task's bash), found by its session file and SLURM_PROCID."""
    session = str(run_dir / "session.pkl")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if session.encode() in argv and Path(argv[0].decode()).name != "bash" \
                and f"SLURM_PROCID={rank}".encode() in env:
            return int(d.name)
    raise AssertionError(f"no process of rank {rank} of {run_dir}")


def test_a_hung_rank_ends_the_job_within_the_runs_timeout(cluster, tmp_path, model, capsys):
    out = tmp_path / "hang"
    code = main(["run", "--site", SITE, "--model", model, *LAYOUT, "--iters", "3", "--timeout-s", str(TIMEOUT),
                 "--inject", "hang:rank=1:phase=transfer:step=2", "--out", str(out)])
    assert code == 1
    err = capsys.readouterr().err
    s = read_summary(out)
    assert s["root_cause"]["rank"] == 1 and "root cause: rank 1: left no report" in err
    took = _job_end(_job(out)) - _drill_at(out)
    # the survivors detect within the timeout, stop waiting 2 s later, srun kills the hung rank 5 s after
    # that (before: srun --wait=180 from the profile's timeout, ~190 s)
    assert took < TIMEOUT + 15, f"job ended {took:.1f} s after the hang (timeout {TIMEOUT} s)"


def test_a_stopped_rank_ends_the_job_within_the_runs_timeout(cluster, tmp_path, model):
    out = tmp_path / "stop"
    proc = _start(tmp_path, out, model, "--iters", "2000", "--timeout-s", str(TIMEOUT))
    try:
        wait_for(lambda: _committed(out), what="a first commit")
        pid = _rank_pid(out, 2)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.time()
        _stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    took = _job_end(_job(out)) - stopped
    assert took < TIMEOUT + 15, f"job ended {took:.1f} s after SIGSTOP (timeout {TIMEOUT} s)"
    s = read_summary(out)
    assert s["root_cause"]["rank"] == 2 and "2" in s["lost_ranks"]


def test_a_killed_rank_costs_no_timeout(cluster, tmp_path, model, capsys):
    """Rank 0 (the store's host) and the others know at once that the killed rank is gone (its task
    wrote logs/rank-3.exit) and do not wait `--timeout-s` for its report."""
    out = tmp_path / "kill"
    timeout = 30
    code = main(["run", "--site", SITE, "--model", model, *LAYOUT, "--iters", "3", "--timeout-s", str(timeout),
                 "--inject", "kill:rank=3:phase=transfer:step=2", "--out", str(out)])
    assert code == 1, capsys.readouterr().err
    took = _job_end(_job(out)) - _drill_at(out)
    # measured: within the second of the kill (srun --wait=5 bounds a slow exit); before: timeout + 5 s
    assert took < timeout / 3, f"job ended {took:.1f} s after the kill (before: timeout + 5 = {timeout + 5} s)"
    s = read_summary(out)
    assert s["root_cause"]["rank"] == 3 and sorted(s["lost_ranks"]) == ["3"]
    assert (out / "logs" / "rank-3.exit").read_text().strip() == "137"  # 128 + SIGKILL


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_to_the_cli_cancels_the_job_like_ctrl_c(cluster, tmp_path, model, sig):
    out = tmp_path / "term"
    proc = _start(tmp_path, out, model, "--iters", "2000")
    try:
        wait_for(lambda: _committed(out), what="a first commit")
        proc.send_signal(sig)
        _stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    job = _job(out)
    assert f"interrupted by {sig.name}: cancelled Slurm job(s) {job}" in stderr and "Traceback" not in stderr
    s = read_summary(out)
    assert s["slurm"]["interrupted"] and not s["ok"]
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
    queue = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout
    assert "RUNNING" not in queue and "PENDING" not in queue
    wait_for(lambda: subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "--format=State"], capture_output=True,
                                     text=True).stdout.startswith("CANCELLED"), 30, "sacct to say CANCELLED")


def test_jobs_settles_a_run_whose_launcher_was_killed(cluster, tmp_path, model, capsys):
    """SIGKILL of an attached `reshardctl run`: the job runs on, run.json says `submitted`; once the job
    ended, `reshardctl jobs` collects it: summary.json, and run.json's final state."""
    out = tmp_path / "orphan"
    proc = _start(tmp_path, out, model, "--iters", "2")
    try:
        index = tmp_path / "state" / "reshardctl" / "slurm-runs.jsonl"
        wait_for(lambda: index.exists() and str(out) in index.read_text(), what="the submission")
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads((out / "run.json").read_text())["state"] == "submitted"
    _job_end(_job(out))
    assert main(["jobs"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "finished" and run["settled"]["from"] == "submitted"
    s = read_summary(out)
    assert s["ok"] and s["collected"] and s["transports"]["reshard"]["verified"]
