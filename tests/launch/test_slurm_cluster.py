"""`reshardctl run` / `bench` / `collect` / `cancel` / `jobs` against a real Slurm cluster.

The cluster is the one `tests/slurm/cluster-up.sh` starts on this machine (`.ci/run` does it before the
tests): 4 virtual nodes, gloo on CPU, the shipped `slurm-local` profile. Outside CI these tests skip when
no cluster answers, and say why; with RESHARDCTL_REQUIRE_SLURM=1 (as in CI) a missing cluster fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from reshardctl.cli import main
from reshardctl.site.loading import shipped_dir

from helpers.slurm_cluster import read_summary, wait_for


pytestmark = pytest.mark.usefixtures("slurm_state")


def _profile(tmp_path, **slurm) -> str:
    data = yaml.safe_load((shipped_dir() / "slurm-local.yaml").read_text())
    data["slurm"].update(slurm)
    data["refit"]["timeout_s"] = 60
    data["refit"]["rendezvous_timeout_s"] = 60
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


LAYOUT = ["--train", "tp=2", "--infer", "tp=2"]


def test_hetjob_bench_runs_all_transports_verified(cluster, tmp_path, model, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters", "1", "--out", str(out),
                 "--json"])
    assert code == 0, capsys.readouterr().err
    s = json.loads(capsys.readouterr().out)
    assert s == read_summary(out) and s["ok"] and s["launcher"] == "slurm"
    assert set(s["transports"]) == {"reshard", "gather_broadcast", "hybrid"}
    for t in s["transports"].values():
        assert t["verified"] and t["failures"] == [] and t["raw_baseline_s"] > 0
    sl = s["slurm"]
    (job,) = sl["job_ids"].values()
    assert sl["mode"] == "hetjob" and sl["states"] == {job: "COMPLETED"}
    assert sl["nodes"]["train"] and sl["nodes"]["infer"] and sl["nodes"]["train"] != sl["nodes"]["infer"]
    assert sl["queue_s"] >= 0 and sl["startup_s"] >= 0 and sl["run_s"] > 0
    assert "#SBATCH hetjob" in (out / "slurm" / "hetjob.sbatch").read_text()
    assert json.loads((out / "slurm" / "jobs.json").read_text())["job_ids"] == sl["job_ids"]
    # 4 ranks, one rendezvous each for all three transports (one world), each with its own logs
    events = sorted((out / "events").glob("rank-*.jsonl"))
    assert len(events) == 4
    for f in events:
        assert sum('"rendezvous"' in line for line in f.read_text().splitlines()) == 1
    assert sorted(p.name for p in (out / "logs").glob("*.err")) == [f"rank-{r}.err" for r in range(4)]


def test_two_jobs_refit_meets_through_the_rendezvous_file(cluster, tmp_path, model, capsys):
    out = tmp_path / "two"
    code = main(["run", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters", "2", "--out", str(out),
                 "--slurm-mode", "two-jobs"])
    assert code == 0, capsys.readouterr().err
    s = read_summary(out)
    assert s["ok"] and s["transports"]["reshard"]["verified"] and s["transports"]["reshard"]["iterations"] == 2
    ids = s["slurm"]["job_ids"]
    assert set(ids) == {"train", "infer"} and ids["train"] != ids["infer"]
    assert set(s["slurm"]["states"].values()) == {"COMPLETED"}
    _addr, port, trainer_job = (out / "slurm" / "rendezvous").read_text().split()
    assert trainer_job == ids["train"] and 1400 <= int(port) <= 1999
    assert "slurm (two-jobs)" in capsys.readouterr().out


def test_default_run_on_slurm_shows_reshard_beside_gather_broadcast(cluster, tmp_path, model, capsys):
    """`run` without --transport runs the same two transports on Slurm as locally (one allocation, one
    rendezvous per rank), and says how they compare; the job is named after the run, not `bench`."""
    out = tmp_path / "default"
    code = main(["run", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters", "1", "--out", str(out)])
    io = capsys.readouterr()
    assert code == 0, io.err
    s = read_summary(out)
    assert list(s["transports"]) == ["reshard", "gather_broadcast"] and s["launcher"] == "slurm"
    assert all(t["verified"] for t in s["transports"].values())
    assert "reshard was " in io.out and " gather_broadcast (median refit " in io.out and "both verified" in io.out
    assert any(line.startswith("gather_broadcast") for line in io.out.splitlines())  # its row in the table
    for f in (out / "events").glob("rank-*.jsonl"):
        assert sum('"rendezvous"' in line for line in f.read_text().splitlines()) == 1
    assert "reshardctl-reshard" in (out / "slurm" / "hetjob.sbatch").read_text()
    # with a drill, the profile's transport only, as locally
    from reshardctl.commands.run import default_transports

    assert default_transports("reshard", explicit=False, drills=True) == ["reshard"]


def test_detached_run_is_listed_then_collected(cluster, tmp_path, model, capsys):
    out = tmp_path / "det"
    code = main(["run", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters", "1", "--out", str(out),
                 "--detach", "--json"])
    assert code == 0
    info = json.loads(capsys.readouterr().out)
    assert info["run_dir"] == str(out.resolve()) and not (out / "summary.json").exists()
    assert main(["jobs", "--all", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["run_dir"] for r in listed] == [str(out.resolve())]
    assert main(["collect", str(out), "--wait", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ok"] and s["collected"] and s["transports"]["reshard"]["verified"]
    assert s["slurm"]["job_ids"] == info["job_ids"]


def _committed(run_dir: Path) -> bool:
    return any('"phase":"commit"' in f.read_text() for f in (run_dir / "events").glob("rank-*.jsonl")) \
        if (run_dir / "events").is_dir() else False


def test_a_job_cancelled_mid_run_is_reported_cancelled(cluster, tmp_path, model, capsys):
    """collect while the job runs: exit 3, nothing written; cancel: says the state it cancelled from;
    the summary: cancelled by whom and when (interrupted), not a crash; a second cancel: nothing to
    cancel, exit 1."""
    import getpass

    out = tmp_path / "cancel"
    assert main(["run", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters", "2000", "--out", str(out),
                 "--detach"]) == 0
    wait_for(lambda: _committed(out), what="a first commit")
    capsys.readouterr()
    assert main(["collect", str(out)]) == 3
    assert "the run has not ended (Slurm job" in capsys.readouterr().err and not (out / "summary.json").exists()
    assert main(["cancel", str(out)]) == 0
    said = capsys.readouterr().out
    (job,) = json.loads((out / "slurm" / "jobs.json").read_text())["job_ids"].values()
    assert f"Slurm job {job} (het): RUNNING -> cancelled" in said, said
    code = main(["collect", str(out), "--wait"])
    assert code == 1
    err = capsys.readouterr().err
    s = read_summary(out)
    assert s["slurm"]["states"][job] == "CANCELLED" and not s["ok"] and s["interrupted"]
    c = s["slurm"]["cancelled"]
    assert c["by"] == getpass.getuser() and c["via"] == "reshardctl cancel" and c["jobs"] == {job: "RUNNING"}
    assert f"cancelled by {c['by']} at {c['at']} (reshardctl cancel)" in err and "it never started?" not in err
    assert main(["cancel", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"nothing cancelled in {out}" in err and f"Slurm job {job} (het): CANCELLED, ended already" in err


def test_a_run_submitted_by_hand_from_plan_out_two_jobs(cluster, tmp_path, model, capsys):
    """`plan --out DIR` with a two-jobs profile prints the lines that submit both jobs (the inference job
    held until the trainer job started) and collect them; run literally, the refit is verified, the
    run is listed by `jobs` and its summary tracks both jobs."""
    site = _profile(tmp_path, mode="two-jobs")
    out = tmp_path / "byhand"
    assert main(["plan", "--site", site, "--model", model, *LAYOUT, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    lines = err[err.index("to run it on Slurm by hand"):].splitlines()[1:4]
    assert "--dependency=after:" in lines[1] and "infer.sbatch" in lines[1] and "train.sbatch" in lines[0], lines
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-euc", "\n".join(line.strip() for line in lines)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = read_summary(out)
    assert s["ok"] and s["collected"] and s["transports"]["reshard"]["verified"]
    assert set(s["slurm"]["job_ids"]) == {"train", "infer"} and s["slurm"]["mode"] == "two-jobs"
    assert main(["jobs", "--all", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["run_dir"] == str(out) and listed["job_ids"] == s["slurm"]["job_ids"]


def _trainer_waiting_for_a_held_inference_job(out: Path, site: str, model: str, capsys):
    """A two-jobs run submitted by hand with its inference job held in the queue, once the trainer job
    says it waits for it: (run directory, trainer job id, inference job id, the trainer job's output)."""
    assert main(["plan", "--site", site, "--model", model, *LAYOUT, "--out", str(out)]) == 0
    capsys.readouterr()

    def sbatch(*argv: str) -> str:
        return subprocess.run(["sbatch", "--parsable", *argv], capture_output=True, text=True,
                              check=True).stdout.strip()

    train = sbatch(str(out / "slurm" / "train.sbatch"))
    infer = sbatch("--hold", f"--dependency=after:{train}", str(out / "slurm" / "infer.sbatch"))
    (out / "slurm" / "train.jobid").write_text(train + "\n")
    (out / "slurm" / "infer.jobid").write_text(infer + "\n")
    said = out / "slurm" / f"train-{train}.out"
    wait_for(lambda: said.is_file() and f"waiting for the inference job {infer}: PENDING" in said.read_text(),
             120, "the trainer job to say it waits for the held inference job")
    return out, train, infer, said


RENDEZVOUS_S = 15


def test_the_trainer_job_waits_for_an_inference_job_held_in_the_queue(cluster, tmp_path, model, capsys):
    """Two jobs on a busy queue: the inference job pends (held here) well past the ranks' rendezvous
    timeout; the trainer job waits for it, saying its queue state, and the refit still runs verified
    once it is released (before, the trainer's ranks gave up after rendezvous_timeout_s)."""
    site = _profile(tmp_path, mode="two-jobs")
    data = yaml.safe_load(Path(site).read_text())
    # short, so the held job outlasts it, yet long enough for both jobs' ranks to start on a loaded machine
    # (5 s: the inference ranks gave up on the trainer's store while its ranks were still importing torch)
    data["refit"]["rendezvous_timeout_s"] = RENDEZVOUS_S
    Path(site).write_text(yaml.safe_dump(data))
    out, train, infer, said = _trainer_waiting_for_a_held_inference_job(tmp_path / "held", site, model, capsys)
    time.sleep(RENDEZVOUS_S + 3)  # longer than the ranks' rendezvous timeout: the trainer job is still there
    assert subprocess.run(["squeue", "-h", "-j", train, "-o", "%T"], capture_output=True, text=True).stdout.strip() \
        == "RUNNING"
    subprocess.run(["scontrol", "release", infer], check=True)
    assert main(["collect", str(out), "--job", f"{train},{infer}", "--wait", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ok"] and s["transports"]["reshard"]["verified"], s.get("error")
    assert "(JobHeldUser)" in said.read_text()


def test_the_trainer_job_stops_waiting_when_the_pending_inference_job_is_cancelled(cluster, tmp_path, model, capsys):
    """docs/slurm.md: an inference job that leaves the queue without starting ends the trainer job's wait at
    the next of its 30 s checks (not after slurm.peer_wait_s, 1800 s): the trainer job fails saying so, its
    ranks never start, and `collect` reads the run as failed (exit 1), never as still running."""
    site = _profile(tmp_path, mode="two-jobs")
    out, train, infer, said = _trainer_waiting_for_a_held_inference_job(tmp_path / "gone", site, model, capsys)
    subprocess.run(["scancel", infer], check=True)
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", train, "-o", "%T"], capture_output=True,
                                        text=True).stdout.strip(),
             120, "the trainer job to end after its pending inference job was cancelled")
    text = said.read_text()
    assert f"reshardctl: error: the inference job {infer} left the queue without starting" in text, text
    assert not (out / "events").exists() or not any((out / "events").iterdir())  # no rank started
    assert main(["collect", str(out), "--job", f"{train},{infer}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and train in err, err
    # the trainer job's own reason comes first, before the jobs' states and the ranks that never started
    assert err.index(f"train-{train}.out: the inference job {infer} left the queue without starting") \
        < err.index(f"Slurm job {train}: FAILED"), err


def test_collect_of_a_two_jobs_run_needs_both_job_ids(tmp_path, model, capsys):
    """Tracking one of the two jobs would read a run half-watched: refused before any command runs."""
    site = _profile(tmp_path, mode="two-jobs")
    out = tmp_path / "one-id"
    assert main(["plan", "--site", site, "--model", model, *LAYOUT, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["collect", str(out), "--job", "12"]) == 2
    assert "give both job ids, the trainer job's first: --job TRAIN_ID,INFER_ID" in capsys.readouterr().err
    assert main(["collect", str(out), "--job", "12,12"]) == 2
    assert "two jobs with two ids" in capsys.readouterr().err
    assert not (out / "slurm" / "jobs.json").exists()


def test_a_bad_python_path_surfaces_the_failing_ranks_stderr(cluster, tmp_path, model, capsys):
    out = tmp_path / "badpy"
    site = _profile(tmp_path, python="/nonexistent/bin/python3")
    code = main(["run", "--site", site, "--model", model, *LAYOUT, "--iters", "1", "--out", str(out)])
    assert code == 1
    err = capsys.readouterr().err
    s = read_summary(out)
    (job,) = s["slurm"]["job_ids"].values()
    assert s["slurm"]["states"][job] == "FAILED" and not s["ok"]
    for text in (err, s["error"]):
        assert "/nonexistent/bin/python3: No such file or directory" in text
        assert "ranks 0-3: left no report" in text and f"Slurm job {job}: FAILED" in text


def test_hostile_profile_values_never_execute(cluster, tmp_path, model, capsys):
    """Values holding $(...), backticks, quotes and a newline reach the ranks as text and never run."""
    marks = tmp_path / "marks"
    marks.mkdir()
    payload = f"$(touch {marks}/a) `touch {marks}/b` '; touch {marks}/c; ' \"; touch {marks}/d\"\ntouch {marks}/e"
    seen = tmp_path / "seen"
    site = _profile(tmp_path, env={"HOSTILE": payload},
                    extra_srun=[f"--comment=$(touch {marks}/f)"],
                    # slurm.setup is the site's own shell, run as written: here it records what a rank sees
                    setup=[f"printf '%s' \"$HOSTILE\" > {seen}"])
    out = tmp_path / "hostile"
    code = main(["run", "--site", site, "--model", model, *LAYOUT, "--iters", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert read_summary(out)["transports"]["reshard"]["verified"]
    assert seen.read_text() == payload
    assert sorted(p.name for p in marks.iterdir()) == []


def _interruptible() -> None:
    """In the child before exec: SIGINT at its default and unblocked, as in a terminal (a SIGINT ignored or
    blocked by the test's own process, e.g. a parallel test worker, would be inherited, and Python
    then leaves Ctrl-C ignored, as it should for a command started that way)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_state(pid: int) -> str:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return "(gone)"
    return " ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def test_ctrl_c_cancels_the_jobs_and_says_so(cluster, tmp_path, model):
    out = tmp_path / "ctrlc"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "reshardctl", "run", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters",
         "2000", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=_interruptible)
    state = ""
    try:
        wait_for(lambda: _committed(out), what="a first commit")
        state = _signal_state(proc.pid)
        proc.send_signal(signal.SIGINT)
        _stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"no exit 120 s after SIGINT; the CLI's signal state then: {state}; "
                             f"stderr: {exc.stderr!r}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    s = read_summary(out)
    (job,) = s["slurm"]["job_ids"].values()
    assert f"cancelled Slurm job(s) {job}" in stderr
    assert s["slurm"]["interrupted"] and not s["ok"]
    wait_for(lambda: subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "--format=State"], capture_output=True,
                                     text=True).stdout.startswith("CANCELLED"), 30, "sacct to say CANCELLED")


def test_two_jobs_cancelling_one_cancels_the_other(cluster, tmp_path, model, capsys):
    """Detached (no reshardctl watching): the inference job's script cancels the trainer job itself."""
    out = tmp_path / "peer"
    assert main(["run", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters", "2000", "--out", str(out),
                 "--slurm-mode", "two-jobs", "--detach", "--json"]) == 0
    ids = json.loads(capsys.readouterr().out)["job_ids"]
    wait_for(lambda: _committed(out), what="a first commit")
    subprocess.run(["scancel", ids["infer"]], check=True)
    assert main(["collect", str(out), "--wait"]) == 1
    s = read_summary(out)
    assert s["slurm"]["states"] == {ids["train"]: "CANCELLED", ids["infer"]: "CANCELLED"}
    assert "CANCELLED" in capsys.readouterr().err
    # cancelled with scancel, not `reshardctl cancel`: who and when come from accounting ("CANCELLED by <uid>")
    import getpass

    c = s["slurm"]["cancelled"]
    assert s["interrupted"] and c["by"] == getpass.getuser() and c["via"] == "scancel or Slurm" and c["at"][:2] == "20"


def test_a_failing_slurm_command_names_the_command_its_code_and_stderr(cluster):
    from reshardctl.launch import slurm_cli

    with pytest.raises(slurm_cli.SlurmCommandError) as e:
        slurm_cli.run(["scontrol", "show", "job", "987654321"])
    assert e.value.argv == ["scontrol", "show", "job", "987654321"] and e.value.returncode == 1
    assert "Invalid job id" in e.value.stderr and "`scontrol show job 987654321` failed (exit code 1)" in str(e.value)


def test_a_fault_drill_through_slurm_names_the_root_cause(cluster, tmp_path, model, capsys):
    """`--inject` reaches the ranks through the session file; the killed rank is the root cause, the
    survivors' failures are counted as knock-on, and they stop within the run's bound (timeout + 5 s)."""
    out = tmp_path / "drill"
    code = main(["run", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters", "2", "--timeout-s", "10",
                 "--inject", "kill:rank=3:phase=transfer", "--out", str(out)])
    assert code == 1
    io = capsys.readouterr()
    err = io.err
    s = read_summary(out)
    # the root cause once, on stderr; the survivors in one line; stdout the results only
    assert err.count("root cause") == 1 and "root cause" not in io.out and "3 other ranks stopped because of it: " in err
    assert s["root_cause"]["rank"] == 3 and s["root_cause"]["error"] == "RankLost"
    assert s["knock_on_failures"] == 3 and s["drills"] and s["drills"][0]["rank"] == 3
    assert s["detection_s"] is not None and s["detection_s"] <= 10 + 5
    assert "root cause: rank 3: left no report" in err
    assert not s["transports"]["reshard"]["verified"]


def test_calibrate_through_slurm_measures_two_of_the_sites_nodes(cluster, tmp_path, capsys):
    out = tmp_path / "cal.json"
    code = main(["calibrate", "--site", "slurm-local", "--reps", "2", "--out", str(out),
                 "--run-dir", str(tmp_path / "caljob"), "--json"])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["launcher"] == "slurm" and data["ranks"] == 8  # two whole nodes of 4 ranks
    assert len(data["hosts"]) == 2 and set(data["hosts"]) <= {"n1", "n2", "n3", "n4"}  # Slurm's node names
    (job,) = data["slurm"]["job_ids"].values()
    assert data["slurm"]["states"] == {job: "COMPLETED"}
    assert all(v > 0 for v in data["figures"].values())
    assert len(list((tmp_path / "caljob" / "results").glob("rank-*.json"))) == 8
    # the file is a calibration the planner reads for this site
    from reshardctl.site.measured import read_measured

    assert read_measured(out, "slurm-local").ranks == 8


def test_an_outsider_with_the_port_cannot_stop_a_slurm_run(cluster, tmp_path, model, capsys):
    """docs/runs.md "The run's store", on Slurm: a process that reads the run's port from its events but
    has no token (tests/helpers/store_attacker.py) cannot reach the store on another interface, finds no token
    digest, forges failure records while rank 1 pauses at step 2, cannot join on the former prefix; the
    run commits every refit."""
    from helpers.store_attacker import other_address

    other = other_address()
    if other is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    out, res_path = tmp_path / "attacked", tmp_path / "attacker.json"
    attacker = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "helpers" / "store_attacker.py"), str(out),
                                 str(res_path), other, "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        code = main(["run", "--site", "slurm-local", "--model", model, *LAYOUT, "--iters", "3", "--transport",
                     "reshard", "--timeout-s", "30", "--inject", "hang:rank=1:phase=transfer:step=2:seconds=8",
                     "--out", str(out)])
        log = attacker.communicate(timeout=120)[0].decode()
    finally:
        if attacker.poll() is None:
            attacker.kill()
    assert code == 0, capsys.readouterr().err
    res = json.loads(res_path.read_text())
    assert res["loopback_connect"]["ok"] and not res["other_interface_connect"]["ok"], (res, log)
    assert 1400 <= res["port"] <= 1999
    assert not res["old_digest"]["ok"] and not res["init_old_prefix"]["ok"]
    forged = {f["target"] for f in res["forged"] if f["ok"]}
    assert "raw" in forged and any(t.startswith("seen ") for t in forged), res["forged"]
    commits = [json.loads(x) for r in range(4) for x in (out / "events" / f"rank-{r}.jsonl").read_text().splitlines()
               if '"commit"' in x]
    last = [max(e["start"] for e in commits if e["rank"] == r and e["phase"] == "commit") for r in range(4)]
    assert res["forged_at"] < min(last)  # forged while every rank still had a refit to commit
    s = read_summary(out)
    assert s["ok"] and s["transports"]["reshard"]["verified"] and s["transports"]["reshard"]["committed_steps_agree"]


@pytest.mark.parametrize("mode, refused", [("hetjob", "jobs.json"), ("two-jobs", "train.jobid")])
def test_job_ids_survive_a_jobs_json_the_disk_refuses(cluster, tmp_path, model, mode, refused):
    """`slurm/jobs.json` (two-jobs: `slurm/train.jobid`) refused after sbatch succeeded (issue 22): before, the job ran on untracked with
    `run.json` "submitting" and the ids only in Slurm. A stand-in `sbatch` first on PATH runs the real
    sbatch, then makes `slurm/` immutable (chattr +i, root): the write that follows fails as on a
    read-only disk. Now the job is cancelled, the error names the file and the job id, run.json is final."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("making slurm/ immutable after the submission needs root and chattr")
    probe = tmp_path / "probe"
    probe.mkdir()
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip(f"chattr +i is not permitted on {tmp_path}'s filesystem")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\n"
        f'out=$("{shutil.which("sbatch")}" "$@") || exit $?\n'
        'for last; do :; done\n'
        f'chattr +i "$(dirname "$last")" && echo "$out" >> "{log}"\n'
        'echo "$out"\n')
    (bin_dir / "sbatch").chmod(0o755)
    out = tmp_path / "refused"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PATH=f"{bin_dir}:{os.environ['PATH']}")
    try:
        p = subprocess.run([sys.executable, "-m", "reshardctl", "run", "--site", "slurm-local", "--model", model,
                            *LAYOUT, "--iters", "1", "--out", str(out), "--slurm-mode", mode], capture_output=True,
                           text=True, env=env,
                           timeout=600, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(["chattr", "-i", str(out / "slurm")], capture_output=True)
    job = log.read_text().split()[0].split(";")[0]  # the id the real sbatch printed
    err = " ".join(p.stderr.split())
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert log.read_text().count("\n") == 1  # two-jobs: the inference job was never submitted
    assert f"{out / 'slurm' / refused}: Operation not permitted" in err, err
    assert f"the job ids of the submitted run could not be recorded; cancelled Slurm job(s) {job}" in err, err
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "failed" and job in run["error"]
    wait_for(lambda: job not in subprocess.run(["squeue", "-h", "-o", "%i", "-j", job], capture_output=True,
                                                text=True).stdout, 60, "the job to leave the queue")
    st = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "--format=State"], capture_output=True,
                        text=True).stdout
    assert "COMPLETED" not in st and "RUNNING" not in st, st
