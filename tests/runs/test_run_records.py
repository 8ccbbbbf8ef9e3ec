"""What summary.json says about faults (issue 22, item 8): every requested drill and whether it fired
(successful runs too), detection times measured from a drill's own event and never negative (null for a
fault nobody injected), where a lost Slurm rank was (from its last event), and drills that can never
fire refused as bad input before any process starts. Real rank processes, a real Slurm cluster."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from reshardctl.cli import main

from helpers.slurm_cluster import cluster_problem

LAYOUT = ["--train", "tp=2", "--infer", "tp=2"]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("spec,msg", [
    ("corrupt:rank=1", "rank 1 is a trainer rank (0..1); trainer ranks only send, so a corrupt drill never fires"),
    ("corrupt:rank=0:step=1", "rank 0 is a trainer rank"),
    ("kill:rank=2:step=4", "step 4 is outside the run's refits, steps 1..3"),
    ("hang:rank=3:phase=verify:step=0", "step 0 is outside the run's refits, steps 1..3"),
    ("slow:rank=4", "rank 4 is outside the run's 4 ranks (0..3)"),
])
def test_a_drill_that_can_never_fire_is_bad_input(tmp_path, small_llama, capsys, spec, msg):
    """1 warm-up + 2 timed refits of one transport: steps 1..3; ranks 0-1 train, 2-3 infer."""
    out = tmp_path / "run"
    code = main(["run", "--model", small_llama, *LAYOUT, "--iters", "2", "--warmup", "1", "--out", str(out),
                 "--inject", spec])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert msg in err and "--inject" in err and "Traceback" not in err
    assert not out.exists()  # refused before the run directory, let alone a process


def test_the_last_step_of_the_run_is_accepted_and_fires(tmp_path, small_llama, capsys):
    """The bound is exact: step 3 (the last refit of 1 warm-up + 2) fires; a slow drill does not fail the
    run, and the successful run's summary lists it as fired, with its time and step."""
    out = tmp_path / "run"
    code = main(["run", "--model", small_llama, *LAYOUT, "--iters", "2", "--warmup", "1", "--out", str(out),
                 "--inject", "slow:rank=1:factor=2:step=3", "--json"])
    assert code == 0, capsys.readouterr().err
    s = _summary(out)
    assert s["ok"]
    (d,) = s["drills"]
    assert d["fired"] is True and d["rank"] == 1 and d["step"] == 3 and d["kind"] == "slow"
    assert d["drill"] == "slow x2 rank 1 in phase transfer at step 3"
    assert isinstance(d["at"], float) and abs(d["at"] - time.time()) < 600
    assert s["detection_s"] is None and s["root_cause"] is None


def test_every_requested_drill_is_listed_fired_or_not(tmp_path, small_llama, capsys):
    """The kill at step 1 ends the run, so the slow drill of step 2 never fires: both are listed."""
    out = tmp_path / "run"
    code = main(["run", "--model", small_llama, *LAYOUT, "--iters", "2", "--warmup", "0", "--timeout-s", "10",
                 "--out", str(out), "--inject", "kill:rank=2:phase=transfer:step=1",
                 "--inject", "slow:rank=1:factor=2:step=2"])
    assert code == 1
    s = _summary(out)
    assert [(d["drill"], d["fired"]) for d in s["drills"]] == [
        ("kill rank 2 in phase transfer at step 1", True), ("slow x2 rank 1 in phase transfer at step 2", False)]
    assert s["drills"][1]["at"] is None
    assert s["detection_s"] is not None and 0 <= s["detection_s"] <= 10 + 5
    assert s["root_cause"]["rank"] == 2 and s["root_cause"]["phase"] == "transfer" and s["root_cause"]["step"] == 1


def _rank_pids(parent: int) -> list[int]:
    """The rank processes of ``parent``, by /proc: its spawned children (``spawn_main``), or the children
    of its fork server (gloo ranks fork from it: multiprocessing's ``forkserver``)."""
    procs = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        procs[int(d.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd)
    servers = {pid for pid, (ppid, cmd) in procs.items() if ppid == parent and "forkserver" in cmd}
    return sorted(pid for pid, (ppid, cmd) in procs.items()
                  if (ppid == parent and "spawn_main" in cmd and "resource_tracker" not in cmd) or ppid in servers)


def test_a_random_kill_has_no_negative_detection_time(tmp_path, small_llama, capsys):
    """SIGKILL of a rank from outside (no drill, as in the review's 22 random kills): there is no fault
    event to measure from, so detection_s is null, and no failure row has a negative detected_after_s
    (it was -0.6 s: the launcher's notice time was taken as the fault's)."""
    out = tmp_path / "run"
    killed: list[int] = []

    def killer() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            ev = out / "events"
            commits = sum(f.read_text().count('"phase":"commit"') for f in ev.glob("rank-*.jsonl")) if ev.is_dir() else 0
            pids = _rank_pids(os.getpid())
            if commits >= 8 and len(pids) == 4:  # mid-run: a few refits committed everywhere
                os.kill(pids[-1], signal.SIGKILL)
                killed.append(pids[-1])
                return
            time.sleep(0.05)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    code = main(["run", "--model", small_llama, *LAYOUT, "--iters", "400", "--warmup", "0", "--timeout-s", "5",
                 "--transport", "reshard", "--out", str(out)])
    th.join()
    assert killed, "the rank was not killed (the run ended first)"
    assert code == 1
    s = _summary(out)
    assert s["drills"] == [] and s["root_cause"]["error"] == "RankLost"
    assert s["detection_s"] is None
    rows = s["transports"]["reshard"]["failures"]
    assert len(rows) == 4 and all(r.get("detected_after_s", 0) >= 0 for r in rows)


def test_detection_is_never_negative_nor_measured_without_a_drill():
    from reshardctl.runs.failures import failure_summary

    lost = {"rank": 3, "at": 100.0, "error": "RankLost"}
    early = {"rank": 0, "at": 99.4, "error": "TransferError", "knock_on": True}
    late = {"rank": 1, "at": 100.2, "error": "TransferError", "knock_on": True}
    fs = failure_summary([lost, early, late], [], 5.0)
    assert fs["detection_s"] is None and all("detected_after_s" not in r for r in fs["failures"])
    drill = [{"rank": 3, "fired": True, "at": 99.9}, {"rank": 2, "fired": False, "at": None}]
    fs = failure_summary([lost, early, late], drill, 5.0)
    assert fs["detection_s"] == pytest.approx(0.3)
    assert "detected_after_s" not in fs["failures"][1]  # before the drill's time (another host's clock)


@pytest.mark.slurm
def test_a_lost_slurm_rank_says_where_it_was(tmp_path, small_llama, capsys):
    """A rank killed on Slurm leaves no report; its record's phase and step come from the last event it
    wrote (they were null)."""
    why = cluster_problem()
    if why is not None:
        pytest.skip(why)
    out = tmp_path / "drill"
    code = main(["run", "--site", "slurm-local", "--launcher", "slurm", "--model", small_llama, *LAYOUT,
                 "--iters", "2", "--warmup", "0", "--timeout-s", "10", "--transport", "reshard",
                 "--inject", "kill:rank=3:phase=verify:step=2", "--out", str(out)])
    assert code == 1, capsys.readouterr().err
    s = _summary(out)
    rc = s["root_cause"]
    assert (rc["rank"], rc["error"], rc["phase"], rc["step"]) == (3, "RankLost", "verify", 2)
    assert [(d["drill"], d["fired"], d["step"]) for d in s["drills"]] == [
        ("kill rank 3 in phase verify at step 2", True, 2)]
    assert s["detection_s"] is not None and 0 <= s["detection_s"] <= 10 + 5
