"""Resources in the Slurm request (issue 25): the memory estimate checked against the profile's request
before anything is submitted, and the resources a generated het job asked for, read back from the local
cluster's own `scontrol show job` (tests/slurm/cluster-up.sh: 4 nodes x 8 CPUs, 4000 MB, 4 fake GPUs)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

import reshardctl.launch.memory_check as mc
from reshardctl.cli import main
from reshardctl.site import load_profile
from reshardctl.launch.memory_check import PROCESS_BYTES, check_slurm_memory, slurm_node_bytes
from reshardctl.errors import ProfileError
from reshardctl.site.loading import shipped_dir

from helpers.slurm_cluster import read_summary

pytestmark = pytest.mark.usefixtures("slurm_state")
LAYOUT = ["--train", "tp=2", "--infer", "tp=2"]


def _profile(tmp_path, **slurm) -> str:
    data = yaml.safe_load((shipped_dir() / "slurm-local.yaml").read_text())
    data["slurm"].update(slurm)
    data["refit"]["timeout_s"] = 60
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_memory_request_below_the_estimate_is_refused_before_submitting(tmp_path, model, capsys):
    """No cluster needed: the refusal comes before sbatch (exit 2, the key, the estimate and the request
    named, no run directory)."""
    site = _profile(tmp_path, mem_per_cpu="150M", resources={"infer": {"mem_per_cpu": "100M", "cpus_per_task": 1}})
    out = tmp_path / "refused"
    assert main(["run", "--site", site, "--model", model, *LAYOUT, "--iters", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the train ranks' busiest node (2 ranks) needs about 1.00 GiB" in err
    assert "`slurm.mem_per_cpu` 150M x 1 CPU(s) per task x 2 tasks asks Slurm for 0.29 GiB" in err
    assert "`slurm.resources.infer.mem_per_cpu` 100M x 1 CPU(s) per task x 2 tasks asks Slurm for 0.20 GiB" in err
    assert "nothing was submitted" in err and "Traceback" not in err and not out.exists()
    # the files for submitting by hand are refused alike, before any is written
    assert main(["plan", "--site", site, "--model", model, *LAYOUT, "--out", str(out)]) == 2
    assert "`slurm.mem_per_cpu` 150M" in capsys.readouterr().err and not (out / "slurm").exists()


class _Worlds:  # the surface of a plan the node estimate reads besides rank_bytes
    def __init__(self, T, I):
        self.train_world, self.infer_world = T, I


def test_the_busiest_node_of_each_role_is_the_one_checked(monkeypatch):
    monkeypatch.setattr(mc, "rank_bytes", lambda p, r: 1000 * (r + 1))  # rank r holds (r + 1) kB
    got = slurm_node_bytes([_Worlds(6, 3)], 4, host_weights=True)
    # trainer nodes: ranks 0-3 and 4-5; inference: ranks 6-8 on one node
    assert got["train"] == (4 * PROCESS_BYTES + 1000 * (1 + 2 + 3 + 4), 4)
    assert got["infer"] == (3 * PROCESS_BYTES + 1000 * (7 + 8 + 9), 3)
    assert slurm_node_bytes([_Worlds(6, 3)], 4, host_weights=False)["train"] == (4 * PROCESS_BYTES, 4)


def _show(job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, check=True).stdout


def test_a_het_job_asks_slurm_for_each_components_resources(cluster, tmp_path, model, capsys):
    """`run --detach` with per-role resources: `scontrol show job` shows each component's CPUs, memory and
    GPUs per task as the profile asked, then the refit is verified and the summary carries the estimate."""
    site = _profile(tmp_path, cpus_per_task=2, gpus_per_task=1, gpu_bind="single:1", mem_per_cpu="700M",
                    signal="USR1@60", requeue=False, resources={"infer": {"mem_per_cpu": "400M"}})
    out = tmp_path / "res"
    assert main(["run", "--site", site, "--model", model, *LAYOUT, "--iters", "1", "--out", str(out),
                 "--detach", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    (job,) = info["job_ids"].values()
    text = _show(job)
    comps = {m.group(1): m.group(0) for m in re.finditer(r"JobId=\d+ HetJobId=\d+ HetJobOffset=(\d)(?:.|\n)*?(?=\n\n|\Z)",
                                                          text)}
    assert set(comps) == {"0", "1"}, text
    train, infer = comps["0"], comps["1"]
    for c in (train, infer):
        assert "NumTasks=2 CPUs/Task=2" in c and "TresPerTask=gres:gpu:1" in c, c
        assert "gres/gpu=2" in c  # one fake GPU per task, two tasks
    assert "MinMemoryCPU=700M" in train and "MinMemoryCPU=400M" in infer
    assert "Requeue=0" in train
    assert main(["collect", str(out), "--wait", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ok"] and s["transports"]["reshard"]["verified"]
    assert read_summary(out)["memory_estimate_bytes"] >= 2 * PROCESS_BYTES
    (tmp_path / "scontrol-show-job.txt").write_text(text)
    print(text)


def test_check_slurm_memory_names_the_shared_key_and_skips_mem_0(tmp_path, monkeypatch):
    monkeypatch.setattr(mc, "rank_bytes", lambda p, r: 0)
    site = load_profile(_profile(tmp_path, mem="10M"))
    with pytest.raises(ProfileError, match=r"`slurm.mem` 10M per node .* 268435456 > 10485760 bytes"):
        check_slurm_memory([_Worlds(1, 1)], site, 4)
    # mem: 0 asks for all of a node: nothing to compare with; the estimate is still returned
    assert check_slurm_memory([_Worlds(1, 1)], load_profile(_profile(tmp_path, mem=0)), 4) == PROCESS_BYTES


def _commits(run_dir) -> int:
    ev = run_dir / "events"
    return sum(f.read_text().count('"phase":"commit"') for f in ev.glob("rank-*.jsonl")) if ev.is_dir() else 0


def test_the_time_limit_signal_stops_every_rank_at_one_refit_boundary(cluster, tmp_path, model, capsys):
    """`slurm.signal: USR1@60` on a long run: the signal is sent as Slurm sends it before the limit (to
    every task of the job's steps, not the batch shell: `scancel --signal=USR1`, so the test needs no
    minutes-long wait for the limit itself); every rank stops before the same refit, the inference ranks
    end on one committed step, and the summary says the run was interrupted by the time-limit signal."""
    site = _profile(tmp_path, signal="USR1@60")
    out = tmp_path / "sig"
    assert main(["run", "--site", site, "--model", model, *LAYOUT, "--iters", "100000", "--out", str(out),
                 "--detach", "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["job_ids"].values()
    assert "export RESHARDCTL_STOP_SIGNAL=USR1" in (out / "slurm" / "hetjob.sbatch").read_text()
    from helpers.slurm_cluster import wait_for

    wait_for(lambda: _commits(out) >= 8, what="a few committed refits")  # the ranks run (handler armed)
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    assert main(["collect", str(out), "--wait", "--json"]) == 1  # stopped early: not every refit ran
    s = json.loads(capsys.readouterr().out)
    assert s["interrupted"] is True and s["slurm"]["interrupted"] is True
    tl = s["slurm"]["time_limit"]
    assert tl["ranks"] == [0, 1, 2, 3] and "time-limit signal SIGUSR1" in tl["why"]
    reports = {r: json.loads((out / "reports" / f"rank-{r}.json").read_text())["reshard"] for r in range(4)}
    assert {rep["error_type"] for rep in reports.values()} == {"TimeLimitStop"}
    # one boundary: every rank names the same step, the inference ranks (2, 3) hold the same committed step
    steps = {re.search(r"before refit step (\d+)", rep["error_message"]).group(1) for rep in reports.values()}
    assert len(steps) == 1
    committed = {reports[r]["committed_step"] for r in (2, 3)}
    assert len(committed) == 1 and committed != {None} and int(steps.pop()) == committed.pop() + 1
