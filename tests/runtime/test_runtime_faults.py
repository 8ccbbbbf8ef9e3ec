"""Fault drills on real gloo processes: every failure ends the refit on every surviving rank within the
timeout (plus a margin), names its root cause, and leaves every surviving inference rank on its previous
weights (compared byte for byte with the synthetic generator and by checksum); retries and the
gather-and-broadcast fallback then succeed.

Detection times are recorded by the ranks (failure records) and the drills (``drill`` events); the
tests assert them relative to the configured timeout with a generous margin, never as wall-clock
limits of the test itself."""

from __future__ import annotations

import pytest

from reshardctl.errors import TransferError, VerificationError
from reshardctl.launch.local import run_local
from reshardctl.runs.records import read_events

from helpers.runtime_plans import bucket_plan, p2p_plan, rows_cols_case
from helpers.fault_drills import MARGIN, TIMEOUT, drill_time, opts, survivors_detect_within_bound
from helpers.weight_checks import assert_previous_weights


@pytest.fixture
def plan():
    m, src, dst = rows_cols_case()
    return p2p_plan(m, src, dst, per_tensor_rounds=True)


@pytest.mark.parametrize("rank", [1, 3], ids=["trainer", "inference"])
def test_a_killed_rank_ends_the_refit_everywhere_with_its_root_cause(tmp_path, plan, rank):
    with pytest.raises(TransferError) as info:
        run_local(plan, opts(tmp_path, faults=f"kill:rank={rank}:phase=transfer:step=2"))
    err = info.value
    root = err.failures[0]
    assert (root["rank"], root["error"], root["phase"], root["step"]) == (rank, "RankLost", "transfer", 2)
    assert "killed by signal 9" in root["message"] and root["host"]
    assert len(err.failures) == 4 and all(f["knock_on"] or f["error"] != "RankLost" for f in err.failures[1:])
    assert str(err).startswith("local run failed: root cause: rank")
    survivors_detect_within_bound(err, drill_time(tmp_path, rank), TIMEOUT + MARGIN)
    for f in err.failures[1:]:
        assert {"rank", "host", "side", "phase", "step", "peers"} <= set(f)
    assert_previous_weights(tmp_path, plan, 1, [g for g in (2, 3) if g != rank])


def test_a_hung_rank_is_detected_within_the_timeout_and_killed(tmp_path, plan):
    with pytest.raises(TransferError) as info:
        run_local(plan, opts(tmp_path, faults="hang:rank=2:phase=verify:step=2"))
    err = info.value
    root = err.failures[0]
    assert root["rank"] == 2 and root["phase"] == "verify" and "stopped by the launcher" in root["message"]
    times = survivors_detect_within_bound(err, drill_time(tmp_path, 2), TIMEOUT + MARGIN)
    assert max(times) >= TIMEOUT * 0.5  # a silent peer is found by the timeout, not earlier by accident
    assert_previous_weights(tmp_path, plan, 1, [3])


def test_an_exit_at_commit_leaves_every_survivor_on_the_new_weights(tmp_path, plan):
    with pytest.raises(TransferError) as info:
        run_local(plan, opts(tmp_path, faults="exit:rank=3:phase=commit:step=2"))
    err = info.value
    assert err.failures[0]["rank"] == 3 and "exited with code 3" in err.failures[0]["message"]
    # every rank voted OK (rank 3 left after the vote): the surviving inference rank swapped, and its
    # repair (its only peer, rank 3, is gone) says so (docs/commit-protocol.md)
    msg = next(f["message"] for f in err.failures if f["rank"] == 2)
    assert "repair among the inference ranks" in msg and "this rank holds step 2" in msg, msg
    survivors_detect_within_bound(err, drill_time(tmp_path, 3), TIMEOUT + MARGIN)
    assert_previous_weights(tmp_path, plan, 2, [2])


def test_a_corrupted_region_is_caught_and_named(tmp_path, plan):
    with pytest.raises(VerificationError) as info:
        run_local(plan, opts(tmp_path, faults="corrupt:rank=3:step=2"))
    root = info.value.failures[0]
    assert root["rank"] == 3 and root["phase"] == "verify" and "checksum mismatch" in root["message"]
    assert sum(not f["knock_on"] for f in info.value.failures) == 1
    assert_previous_weights(tmp_path, plan, 1, [2, 3])


def test_a_slow_rank_only_slows_the_refit(tmp_path, plan):
    reports = run_local(plan, opts(tmp_path, faults="slow:rank=1:factor=4:step=2"))
    assert all(r.ok for r in reports)
    assert_previous_weights(tmp_path, plan, 3, [2, 3])
    assert drill_time(tmp_path, 1) > 0


def test_a_retry_on_rebuilt_groups_commits(tmp_path, plan):
    reports = run_local(plan, opts(tmp_path, faults="corrupt:rank=3:step=2", retries=1))
    assert all(r.ok for r in reports)
    assert [(a["step"], a["attempt"], a["transport"], a["outcome"][:17]) for a in reports[0].attempts] == [
        (2, 0, "reshard", "VerificationError"), (2, 1, "reshard", "committed")]
    assert_previous_weights(tmp_path, plan, 3, [2, 3])
    ev = read_events(tmp_path / "events" / "rank-2.jsonl")
    assert sum(e["phase"] == "group_init" for e in ev) == 2 and any(e["phase"] == "settle" for e in ev)
    assert {r.committed_step for r in reports if r.side == "infer"} == {3}


def test_a_fallback_retry_uses_gather_and_broadcast(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    fb = bucket_plan(m, src, dst, [[0, 1], [2, 3]])
    reports = run_local(plan, opts(tmp_path, iterations=2, faults="corrupt:rank=2:step=1", retries=1,
                                   on_failure="fallback"), fallback=fb)
    assert all(r.ok for r in reports)
    assert [a["transport"] for a in reports[2].attempts] == ["reshard", "gather_broadcast"]
    assert_previous_weights(tmp_path, plan, 2, [2, 3])


def test_no_retry_when_a_rank_is_dead(tmp_path, plan):
    with pytest.raises(TransferError) as info:
        run_local(plan, opts(tmp_path, faults="kill:rank=0:phase=transfer:step=2", retries=2))
    assert info.value.failures[0]["rank"] == 0
    assert_previous_weights(tmp_path, plan, 1, [2, 3])
