"""The live progress display (reshardctl/commands/progress.py): a queue's states said without ``None``,
the end state last, plain lines (never a carriage return) when stderr is not a terminal; and a real
local `run` with stderr piped."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from reshardctl.commands.progress import LiveProgress, end_line, slurm_state_line
from reshardctl.launch.slurm_cli import JobState

ROOT = Path(__file__).resolve().parents[2]

# a Slurm run as the watch sees it: queued without a reason (squeue prints "None"), with one, running,
# then gone from the queue (accounting not read yet), and the end state from accounting
SEQUENCE = [
    {"812": JobState("812", "PENDING", "None")},
    {"812": JobState("812", "PENDING", "Resources")},
    {"812": JobState("812", "RUNNING", "", "n[1-2]")},
    {},
]
FINAL = {"812": "COMPLETED"}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _drive(prog: LiveProgress, clock: Clock | None = None) -> None:
    prog.start()
    for states, done in zip(SEQUENCE, (0, 0, 8, 8)):  # as the Slurm launcher polls: the counts, then the states
        prog.update(done, 24, None)
        prog.state(states, {"train": 0, "infer": 0})
        if clock is not None:
            clock.t += 1.0
    prog.update(24, 24)
    prog.stop(end_line(FINAL))


def test_plain_lines_when_not_a_terminal_no_none_end_state_last():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=False, width=100)
    _drive(LiveProgress(con, "submitting", clock=Clock()))
    text = buf.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text  # no animation, no escape codes into a pipe or file
    assert "None" not in text
    assert lines == [
        "submitting",
        "job 812 waiting for the queue (0/24)",
        "job 812 PENDING (Resources) (0/24)",
        "job 812 RUNNING on n[1-2] (8/24)",  # a state line carries the counts of its own poll
        "job 812 COMPLETED",  # the end state, not a stale "submitted"
    ]


def test_plain_lines_say_counts_at_most_every_interval():
    buf = io.StringIO()
    clock = Clock()
    prog = LiveProgress(Console(file=buf, force_terminal=False), "refits", every_s=10.0, clock=clock)
    prog.start()
    for done in range(1, 25):  # one count a second for 24 s: said at 10 s and 20 s only
        clock.t = float(done)
        prog.update(done, 24)
    prog.update(what="verify")  # a new phase: said at once
    prog.stop("ranks ended: every refit committed")
    assert buf.getvalue().splitlines() == ["refits", "refits (10/24)", "refits (20/24)", "verify (24/24)",
                                           "ranks ended: every refit committed"]


def test_terminal_bar_shows_state_and_counts_without_none_and_ends_on_end_state():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=100)
    prog = LiveProgress(con, "submitting")
    prog.start()
    prog.state(SEQUENCE[0])
    prog._bar.refresh()
    first = buf.getvalue()
    assert "job 812 waiting for the queue" in first and "None" not in first  # no total yet: no "0/None"
    for states in SEQUENCE[1:]:
        prog.state(states, {"train": 4, "infer": 4})
        prog.update(16, 24)
        prog._bar.refresh()
    prog.stop(end_line(FINAL))
    text = buf.getvalue()
    assert "None" not in text
    assert "job 812 RUNNING on n[1-2]; commits: train 4, infer 4" in text and "16/24" in text
    assert "submitted" not in text  # the jobs leaving the queue keep the last state said
    assert text.rstrip().endswith("job 812 COMPLETED")


def test_disabled_says_nothing():
    buf = io.StringIO()
    _drive(LiveProgress(Console(file=buf, force_terminal=True), "submitting", enabled=False))
    assert buf.getvalue() == ""


def test_state_lines():
    assert slurm_state_line({}) == "submitted, waiting for the queue"
    assert slurm_state_line({"5": JobState("5", "PENDING", "")}) == "job 5 waiting for the queue"
    assert slurm_state_line({"5": JobState("5", "PENDING", "(null)")}) == "job 5 waiting for the queue"
    assert slurm_state_line({"5": JobState("5", "PENDING", "Priority")}) == "job 5 PENDING (Priority)"
    assert end_line({"5": "FAILED", "6": "CANCELLED"}) == "job 5 FAILED, job 6 CANCELLED"
    assert "None" not in end_line({})


def test_piped_local_run_prints_progress_lines_and_no_carriage_return(tmp_path, small_llama):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_COMPATIBLE", None)
    proc = subprocess.run([sys.executable, "-m", "reshardctl", "run", "--model", small_llama, "--train", "tp=2",
                           "--infer", "tp=2", "--iters", "2", "--transport", "reshard", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert "starting ranks" in lines  # the first progress line, plain
    assert lines[-1] == "ranks ended: every refit committed", err
    assert "None" not in err


def test_piped_slurm_run_says_job_states_and_ends_on_the_end_state(cluster, tmp_path, small_llama):
    out = tmp_path / "slurm-run"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "reshardctl", "run", "--site", "slurm-local", "--model", small_llama,
                           "--train", "tp=2", "--infer", "tp=2", "--iters", "1", "--transport", "reshard",
                           "--out", str(out)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "\r" not in err and "\x1b" not in err and "None" not in err
    lines = err.splitlines()
    assert "submitting" in lines
    assert any(line.startswith("job ") and " RUNNING" in line for line in lines), err
    job = next(iter(json.loads((out / "summary.json").read_text())["slurm"]["job_ids"].values()))
    assert lines[-1] == f"job {job} COMPLETED", err  # not a stale "submitted"


def test_piped_collect_wait_says_job_states_and_ends_on_the_end_state(cluster, tmp_path, small_llama):
    out = tmp_path / "detached"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "reshardctl", *argv], capture_output=True, text=True, env=env,
                              cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)

    run = cli("run", "--site", "slurm-local", "--model", small_llama, "--train", "tp=2", "--infer", "tp=2",
              "--iters", "1", "--transport", "reshard", "--out", str(out), "--detach", "--json")
    assert run.returncode == 0, run.stderr
    (job,) = json.loads(run.stdout)["job_ids"].values()
    proc = cli("collect", str(out), "--wait")
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "\r" not in err and "\x1b" not in err and "None" not in err
    assert err.splitlines()[-1] == f"job {job} COMPLETED", err
