"""The bounded pre-connect after the groups are built (runtime/groups.py ``preconnect``; docs/gpu.md
"First contact"): it runs on gloo too, with every program peer and broadcast group, and a peer that
never posts ends it on every other rank within the timeout with a clear error. Real gloo processes."""

from __future__ import annotations

import pytest

from reshardctl.errors import TransferError
from reshardctl.launch.local import run_local
from reshardctl.runtime.baseline import pair_bytes
from reshardctl.runs.records import read_events
from reshardctl.runtime.groups import broadcast_groups
from reshardctl.runtime.preconnect import program_peers

from helpers.runtime_plans import bucket_plan, p2p_plan, rows_cols_case
from helpers.fault_drills import MARGIN, TIMEOUT, drill_time, opts


@pytest.fixture
def plan():
    m, src, dst = rows_cols_case()
    return p2p_plan(m, src, dst, per_tensor_rounds=True)


def _connect_events(run_dir, world: int) -> dict[int, list[dict]]:
    return {r: [e for e in read_events(run_dir / "events" / f"rank-{r}.jsonl") if e["phase"] == "connect"]
            for r in range(world)}


def test_program_peers_are_the_directions_the_plan_moves_bytes_and_they_match_across_ranks(plan):
    world = plan.train_world + plan.infer_world
    peers = {r: program_peers(plan, r) for r in range(world)}
    for r, (sends, recvs) in peers.items():
        out, inc = pair_bytes(plan, r)  # the raw-transfer reference's own walk of the steps
        assert set(sends) == set(out) and set(recvs) == set(inc)
        for s in sends:
            assert r in peers[s][1]  # what r sends, s receives: every exchange has its match
    assert any(sends for sends, _ in peers.values())


@pytest.mark.parametrize("kind", ["p2p", "buckets"])
def test_pre_connect_runs_on_gloo_with_every_peer_and_group(tmp_path, plan, kind):
    if kind == "buckets":
        m, src, dst = rows_cols_case()
        plan = bucket_plan(m, src, dst, [[0], [1, 2], [3]])
    reports = run_local(plan, opts(tmp_path, iterations=1, dump_weights=False))
    assert all(r.ok for r in reports)
    world = plan.train_world + plan.infer_world
    for r, ev in _connect_events(tmp_path, world).items():
        assert len(ev) == 1 and "error" not in ev[0], (r, ev)
        sends, recvs = program_peers(plan, r)
        assert ev[0]["peers"] == len(set(sends) | set(recvs))
        assert ev[0]["groups"] == sum(r in g for g in broadcast_groups(plan))
    if kind == "buckets":
        assert any(e[0]["groups"] for e in _connect_events(tmp_path, world).values())


def test_a_peer_that_never_posts_ends_pre_connect_everywhere_within_the_timeout(tmp_path, plan):
    """Rank 2 hangs after its groups are built, before its pre-connect (first contact, step 1): every
    other rank stops within the timeout plus a margin, in pre-connect or at the common start that
    follows it, with the error saying so; nothing waits for the walltime."""
    with pytest.raises(TransferError) as info:
        run_local(plan, opts(tmp_path, faults="hang:rank=2:phase=connect:step=1"))
    err = info.value
    root = err.failures[0]
    assert root["rank"] == 2 and "stopped by the launcher" in root["message"]
    t0 = drill_time(tmp_path, 2)
    survivors = [f for f in err.failures if f["rank"] != 2]
    assert len(survivors) == plan.train_world + plan.infer_world - 1
    for f in survivors:
        assert f["step"] == 1 and f["phase"] in ("connect", "start"), f
        assert f["at"] - t0 < TIMEOUT + MARGIN, f
    own = [f for f in survivors if not f["knock_on"]]
    # each rank's own bounded stop: the pre-connect's deadline (or gloo's timeout under it) on a rank whose
    # program peers include rank 2; on a rank done with its pre-connect, the common start's control
    # all-reduce, whose tree passes through rank 2, timing out before that rank saw another's failure
    # (which of the two a rank meets first is a race between equal timeouts: both are bounded and named)

    def bounded(f):
        timed_out = "not complete within" in f["message"] or "Timed out" in f["message"]
        if f["phase"] == "connect":
            return "pre-connect" in f["message"] and timed_out
        return "the common start" in f["message"] and timed_out

    assert own and all(bounded(f) for f in own), [(f["rank"], f["phase"], f["message"]) for f in own]
