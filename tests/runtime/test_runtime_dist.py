"""Multi-process refits on gloo (spawned CPU processes, a fresh port per run).

Every destination byte is checked here, in the test process, against ``synthetic_weights.synthetic_region``
(independently of the runtime's own checksums), from the weights each inference rank dumps at the end.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from reshardctl.errors import TransferError, VerificationError
from reshardctl.launch.local import run_local
from reshardctl.launch.ports import free_port
from reshardctl.runtime.contract import RunOptions
from reshardctl.runtime.checksum import SUM_BYTES
from reshardctl.runs.records import read_events
from reshardctl.runtime.session_file import write_session

from helpers.runtime_plans import bucket_plan, p2p_plan, relay_case, row_bucket_case, rows_cols_case, zero_copy_case
from helpers.weight_checks import assert_inference_weights

TIMEOUT = 15.0


def opts(tmp_path, **kw) -> RunOptions:
    base = dict(run_dir=str(tmp_path), timeout_s=TIMEOUT, dump_weights=True, device="cpu")
    base.update(kw)
    return RunOptions(**base)


def test_p2p_uneven_boxes_byte_exact_over_three_refits(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    reports = run_local(plan, opts(tmp_path, iterations=3, first_step=5, full_check=True))
    assert [r.ok for r in reports] == [True] * 4
    assert all(len(r.iterations) == 3 and all(i.committed for i in r.iterations) for r in reports)
    assert_inference_weights(tmp_path, plan, 7)
    sent = sum(i.bytes_sent for r in reports for i in r.iterations[:1])
    got = sum(i.bytes_received for r in reports for i in r.iterations[:1])
    assert sent == got == sum(t.nbytes for t in m.tensors) + m.tensors[3].nbytes  # norm goes to both
    ev = read_events(tmp_path / "events" / "rank-2.jsonl")
    phases = {e["phase"] for e in ev}
    assert {"rendezvous", "group_init", "materialise", "round/transfer", "round/unpack", "verify",
            "verify/full", "commit"} <= phases
    assert "round/pack" in {e["phase"] for e in read_events(tmp_path / "events" / "rank-0.jsonl")}
    assert any(r.peak_staging_bytes > 0 for r in reports)  # rows_cols: column slices go through staging


def test_stage2_relay_round(tmp_path):
    m, src, dst, relay = relay_case()
    plan = p2p_plan(m, src, dst, relay=relay)
    reports = run_local(plan, opts(tmp_path, iterations=2))
    assert all(r.ok for r in reports)
    assert_inference_weights(tmp_path, plan, 2)
    # relays forwarded what they received: their bytes_sent are non-zero
    assert reports[2].iterations[0].bytes_sent > 0 and reports[3].iterations[0].bytes_sent > 0


def test_gather_broadcast_buckets(tmp_path):
    m, src, dst = rows_cols_case()
    plan = bucket_plan(m, src, dst, [[0], [1, 2], [3]])
    reports = run_local(plan, opts(tmp_path, iterations=2, full_check=True))
    assert all(r.ok for r in reports)
    assert_inference_weights(tmp_path, plan, 2)
    phases = {e["phase"] for e in read_events(tmp_path / "events" / "rank-0.jsonl")}
    assert {"bucket/gather", "bucket/broadcast"} <= phases


def test_gather_broadcast_group_spanning_every_trainer_rank(tmp_path):
    """The strong baseline's group on GPU sites: non-root trainer ranks are members (they take part in
    the broadcast and keep nothing); a root other than rank 0."""
    m, src, dst = rows_cols_case()
    plan = bucket_plan(m, src, dst, [[0, 1], [2, 3]], root=1, span="stage")
    reports = run_local(plan, opts(tmp_path, iterations=2))
    assert all(r.ok for r in reports)
    assert_inference_weights(tmp_path, plan, 2)


def test_corrupted_byte_fails_verification_and_nobody_commits(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst)
    with pytest.raises(VerificationError) as info:
        run_local(plan, opts(tmp_path, iterations=3, faults="corrupt:rank=3,step=2"))
    msg = str(info.value)
    assert "rank 3 (infer 1) failed verification" in msg and "checksum mismatch" in msg
    assert_inference_weights(tmp_path, plan, 1)  # step 1 committed, step 2 rolled back everywhere
    reports = info.value.reports
    assert [len(r.iterations) for r in reports] == [1, 1, 1, 1]
    ev = read_events(tmp_path / "events" / "rank-3.jsonl")
    assert any(e["phase"] == "verify" and e.get("verdict") == 1 for e in ev)
    assert any(e["phase"] == "commit" and e.get("error_type") == "VerificationError" for e in ev)


def test_corrupted_broadcast_bucket_is_caught(tmp_path):
    m, src, dst = rows_cols_case()
    plan = bucket_plan(m, src, dst, [[0, 1, 2, 3]])
    with pytest.raises(VerificationError):
        run_local(plan, opts(tmp_path, iterations=2, faults="corrupt:rank=2,step=2"))
    assert_inference_weights(tmp_path, plan, 1)


def test_dead_peer_fails_within_the_timeout(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    with pytest.raises(TransferError) as info:
        run_local(plan, opts(tmp_path, iterations=3, timeout_s=5.0, faults="exit:rank=1:phase=start:step=2:code=17"))
    assert not isinstance(info.value, VerificationError)
    assert "root cause: rank 1 (train 1" in str(info.value) and "exited with code 17" in str(info.value)
    # not a hang: every survivor reported its own failure; none was stopped by the launcher
    assert "stopped by the launcher" not in str(info.value)
    reports = info.value.reports
    assert sorted(r.global_rank for r in reports) == [0, 2, 3] and not any(r.ok for r in reports)
    assert_inference_weights(tmp_path, plan, 1)


def _worker_env(**kw) -> dict:
    """A worker process's environment: this checkout's package first, as the launchers' ranks get it."""
    path = os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])  # tests/: helpers.*
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **kw}


def test_module_entry_with_torchrun_style_env(tmp_path):
    """The worker's one entry, ``--session``, on the launchers' session file (a hand-made plan here; the
    planner's own plans in test_launcher_lifecycle.py), ranks from torchrun-style variables."""
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst)
    options = RunOptions(run_dir=str(tmp_path), iterations=1, timeout_s=15.0, device="cpu", dump_weights=True,
                         faults="slow:rank=1:factor=2")
    session = write_session(tmp_path / "session.pkl", {"plan": plan}, options, warmup=0)
    port = free_port()
    procs = []
    for r in range(4):
        env = _worker_env(RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "reshardctl.runtime.worker", "--session", str(session)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    assert_inference_weights(tmp_path, plan, 1)
    assert (tmp_path / "reports" / "rank-3.json").is_file()
    assert oct((tmp_path / "reports" / "rank-3.json").stat().st_mode & 0o777) == "0o600"
    assert any(e["phase"] == "drill" for e in read_events(tmp_path / "events" / "rank-1.jsonl"))


@pytest.mark.parametrize("what", ["missing", "not-a-session", "plan-entry"])
def test_module_entry_refuses_a_missing_or_foreign_file_as_exit_2(tmp_path, what):
    """A session file that is missing or holds no session: exit 2, one line naming the file, no traceback,
    nothing run; the old ``--plan FILE`` entry is gone (a usage error, exit 2)."""
    path = tmp_path / "session.pkl"
    if what == "not-a-session":
        path.write_bytes(pickle.dumps({"plan": 1}))
    args = ["--plan", str(path), "--run-dir", str(tmp_path)] if what == "plan-entry" else ["--session", str(path)]
    env = _worker_env(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    p = subprocess.run([sys.executable, "-m", "reshardctl.runtime.worker", *args], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    if what == "plan-entry":
        assert "the following arguments are required: --session" in p.stderr, p.stderr
    else:
        assert f"cannot read the session file {path}" in p.stderr, p.stderr
    assert not (tmp_path / "reports").exists() and not (tmp_path / "events").exists()


# ---- zero copy, sessions, bucket root memory -----------------------------------------------------------
def test_zero_copy_regions_byte_exact_and_counted(tmp_path):
    m, src, dst = zero_copy_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    reports = run_local(plan, opts(tmp_path, iterations=2, full_check=True))
    assert all(r.ok for r in reports)
    assert_inference_weights(tmp_path, plan, 2)
    recv = [e for d in (2, 3) for e in read_events(tmp_path / "events" / f"rank-{d}.jsonl") if e["phase"] == "round/unpack"]
    sent = [e for s in (0, 1) for e in read_events(tmp_path / "events" / f"rank-{s}.jsonl") if e["phase"] == "round/pack"]
    assert sum(e["zero_copy_bytes"] for e in recv) > 0 and sum(e["zero_copy_bytes"] for e in sent) > 0
    assert any(e["zero_copy_bytes"] < e["bytes"] for e in recv)  # w.odd still goes packed
    got = sum(i.bytes_received for r in reports for i in r.iterations[:1])
    assert got == sum(t.nbytes for t in m.tensors)


def test_corruption_of_a_zero_copy_region_is_caught_before_commit(tmp_path):
    m, src, dst = zero_copy_case()
    plan = p2p_plan(m, src, dst)  # one round: w.eq (zero copy into the staged weights) lands first
    with pytest.raises(VerificationError) as info:
        run_local(plan, opts(tmp_path, iterations=3, faults="corrupt:rank=2,step=2"))
    msg = str(info.value)
    assert "rank 2 (infer 0) failed verification" in msg and "checksum mismatch" in msg and "w.eq" in msg
    assert_inference_weights(tmp_path, plan, 1)  # step 2 rolled back on every inference rank
    assert [len(r.iterations) for r in info.value.reports] == [1, 1, 1, 1]


def test_session_runs_two_plans_in_the_same_processes(tmp_path):
    from reshardctl.launch.local import launch_local_ranks
    from reshardctl.runtime.baseline import pair_bytes

    m, src, dst = rows_cols_case()
    plans = {"p2p": p2p_plan(m, src, dst, per_tensor_rounds=True), "gb": bucket_plan(m, src, dst, [[0, 1], [2, 3]])}
    out = launch_local_ranks(plans, opts(tmp_path, iterations=2, full_check=True, baseline=True), warmup=1)
    assert list(out) == ["p2p", "gb"]
    for name, reps in out.items():
        assert all(r.ok for r in reps) and [r.global_rank for r in reps] == [0, 1, 2, 3]
        assert all(len(r.iterations) == 2 and all(i.committed for i in r.iterations) for r in reps)
        for r in reps:
            want_out, want_in = pair_bytes(plans[name], r.global_rank)
            assert r.baseline["seconds"] > 0
            assert (r.baseline["bytes_sent"], r.baseline["bytes_received"]) == (sum(want_out.values()), sum(want_in.values()))
    # steps 1..3 (p2p: warmup + 2), 4..6 (gb): every refit checked against the exact synthetic data of its
    # step before its commit (full_check), and the final weights are step 6's
    assert [i.step for i in out["p2p"][2].iterations] == [2, 3]
    assert [i.step for i in out["gb"][2].iterations] == [5, 6]
    assert all(i.full_check_s > 0 for r in out["gb"][2:] for i in r.iterations)
    assert out["gb"][2].baseline["broadcast_bytes"] > 0 and out["p2p"][2].baseline["broadcast_bytes"] == 0
    assert_inference_weights(tmp_path, plans["gb"], 6)
    # one rendezvous: a single group_init event per rank
    assert sum(e["phase"] == "group_init" for e in read_events(tmp_path / "events" / "rank-3.jsonl")) == 1


def test_session_refuses_plans_of_different_worlds():
    from reshardctl.errors import LaunchError
    from reshardctl.launch.local import launch_local_ranks

    m, src, dst = rows_cols_case()
    m2, src2, dst2, relay = relay_case()
    with pytest.raises(LaunchError, match="one session has one set of processes"):
        launch_local_ranks({"a": p2p_plan(m, src, dst), "b": p2p_plan(m2, src2, dst2, relay=relay)}, RunOptions())


@pytest.mark.parametrize("overlap", [False, True])
def test_bucket_root_gathers_straight_into_the_bucket(tmp_path, overlap):
    m, src, dst = row_bucket_case()
    plan = bucket_plan(m, src, dst, [[0], [1], [2]])
    reports = run_local(plan, opts(tmp_path, iterations=2, overlap=overlap, full_check=True))
    assert all(r.ok for r in reports)
    assert_inference_weights(tmp_path, plan, 2)
    bucket = plan.bucket_bytes + SUM_BYTES  # one tensor + its checksum
    in_flight = 2 if overlap else 1
    # the root holds the bucket(s) in flight and nothing else: no gather message buffers
    assert reports[0].peak_staging_bytes <= in_flight * bucket
    assert reports[1].peak_staging_bytes == 0  # the other trainer sends straight from its weights
