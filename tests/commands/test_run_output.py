"""What `run` and `bench` say about themselves: a run of two transports lists those two (summary.json,
plan.json and session.json's inputs, not the planner's "all" three), and each command's "next:" line is
its own (bench points at the change window, never at bench)."""

from __future__ import annotations

import json

import pytest

from reshardctl.cli import main
from reshardctl.commands.run import NEXT_STEPS, render


def test_a_two_transport_run_lists_its_two_transports_everywhere(tmp_path, small_llama, capsys):
    out = tmp_path / "run"  # no --transport: the profile's transport and gather_broadcast beside it
    code = main(["run", "--model", small_llama, "--train", "tp=2", "--infer", "tp=2", "--iters", "1", "--warmup", "0",
                 "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    ran = ["reshard", "gather_broadcast"]
    assert list(summary["transports"]) == ran
    assert summary["inputs"]["transports"] == ran
    for name in ("plan.json", "session.json"):
        assert json.loads((out / name).read_text())["inputs"]["transports"] == ran, name
    render(summary)
    text = capsys.readouterr().out
    assert "hybrid" not in text, text  # nothing of the run's output names a transport it did not run


def _summary(*, bench: bool, slurm: bool = False, ok: bool = True) -> dict:
    st = {"median": 0.1, "p90": 0.1, "min": 0.1, "all": [0.1]}
    tr = {"refit_s": st, "transfer_s": st, "verify_s": st, "effective_gbps": 1.0, "predicted_s": 0.1,
          "measured_vs_predicted": 1.0, "peak_staging_bytes": 10, "verified": True, "failures": []}
    return {"ok": ok, "run_dir": "/runs/bench 1", "transports": {"reshard": tr},
            "speedup_vs_reshard": {"reshard": 1.0},
            "request": {"site": "slurm-local", "run": {"baseline": bench, "transports": ["reshard"]}},
            **({"slurm": {"mode": "hetjob", "job_ids": {"het": "7"}, "states": {"7": "COMPLETED"}}} if slurm else {})}


@pytest.mark.parametrize("slurm", [False, True])
def test_bench_next_steps_point_at_the_change_window_not_at_bench(capsys, slurm):
    render(_summary(bench=True, slurm=slurm))
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("next: `reshardctl promote --site slurm-local --run '/runs/bench 1'`"), last
    assert "reshardctl status --site slurm-local" in last and "reshardctl report '/runs/bench 1'" in last
    assert "reshardctl bench" not in last


def test_run_next_steps_stay_the_runs_own(capsys):
    render(_summary(bench=False))
    assert capsys.readouterr().out.rstrip().endswith(NEXT_STEPS["run"])
    for summary in (_summary(bench=False, slurm=True), _summary(bench=True, ok=False)):
        render(summary)
        assert "next:" not in capsys.readouterr().out  # on Slurm already; a failed run has its error instead
