"""Runtime pieces that need no process group: checksums, environment, packing, weights, events, faults."""

from __future__ import annotations

import json

import pytest
import torch

from reshardctl.errors import InputError, LaunchError, TransferError
from reshardctl.plan.schedule import P2PRound, PeerRegions, Region
from reshardctl.runtime.contract import ExecutablePlan, StaticPlan
from reshardctl.runtime.env import read_rank_env
from reshardctl.runs.records import read_events
from reshardctl.runtime.events import EventLog
from reshardctl.runtime.mirror import mirror_problems
from reshardctl.runtime.drills import Drills, parse_faults
from reshardctl.runtime.buffer_pool import BufferPool
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.wire import link_offsets
from reshardctl.runtime.checkpoint_weights import CheckpointWeights
from reshardctl.runtime.synthetic_weights import restep_, synthetic_region
from reshardctl.runtime.weights import materialise

from helpers.runtime_plans import bucket_plan, model, p2p_plan, relay_case, rows_cols_case, zero_copy_case


def u8(t: torch.Tensor) -> torch.Tensor:
    return (t.reshape(1) if t.dim() == 0 else t).view(torch.uint8)


# ---- environment ----------------------------------------------------------------------------------
BASE = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
NO_CUDA = dict(cuda_available=lambda: False)


def test_env_torchrun():
    e = read_rank_env(2, 2, {**BASE, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, **NO_CUDA)
    assert (e.global_rank, e.side, e.side_rank, e.local_rank, e.backend, e.source) == (3, "infer", 1, 1, "gloo", "torchrun")


def test_env_own_launcher_wins_and_backend_choice():
    env = {**BASE, "RANK": "0", "WORLD_SIZE": "4", "RESHARDCTL_RANK": "1", "RESHARDCTL_WORLD_SIZE": "4"}
    e = read_rank_env(2, 2, env, cuda_available=lambda: True, device_count=lambda: 1)
    assert (e.global_rank, e.side, e.backend, e.source, e.device) == (1, "train", "nccl", "reshardctl", "cuda:0")
    assert read_rank_env(2, 2, {**env, "RESHARDCTL_FORCE_CPU": "1"}, cuda_available=lambda: True).backend == "gloo"
    assert read_rank_env(2, 2, env, force_cpu=True, cuda_available=lambda: True).backend == "gloo"


def test_env_slurm_het_job():
    env = {**BASE, "SLURM_PROCID": "5", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_NTASKS_HET_GROUP_0": "4", "SLURM_NTASKS_HET_GROUP_1": "2"}
    e = read_rank_env(4, 2, env, **NO_CUDA)
    assert (e.global_rank, e.world_size, e.side, e.side_rank, e.local_rank, e.node_rank) == (5, 6, "infer", 1, 1, 2)
    e = read_rank_env(4, 2, {**env, "SLURM_PROCID": "3"}, **NO_CUDA)
    assert (e.side, e.side_rank) == ("train", 3)
    with pytest.raises(LaunchError, match="het group 0 has 4 tasks"):
        read_rank_env(3, 3, env, **NO_CUDA)


def test_env_slurm_two_jobs_and_errors():
    env = {**BASE, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "RESHARDCTL_SIDE": "infer"}
    e = read_rank_env(4, 2, env, **NO_CUDA)
    assert (e.global_rank, e.side, e.side_rank) == (5, "infer", 1)
    with pytest.raises(LaunchError, match="needs 4"):
        read_rank_env(4, 2, {**env, "RESHARDCTL_SIDE": "train"}, **NO_CUDA)
    with pytest.raises(LaunchError, match="no rendezvous address"):
        read_rank_env(1, 1, {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, **NO_CUDA)
    with pytest.raises(LaunchError, match="world size 3"):
        read_rank_env(1, 1, {**BASE, "RANK": "0", "WORLD_SIZE": "3"}, **NO_CUDA)
    with pytest.raises(LaunchError, match="no rank"):
        read_rank_env(1, 1, BASE, **NO_CUDA)


# ---- weights --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float8_e4m3fn", "float64", "int8"])
def test_synthetic_regions_agree_with_the_full_tensor_and_restep(dtype):
    m = model([("t", (9, 7), dtype)])
    t = m.tensors[0]
    full = synthetic_region(t, ((0, 9), (0, 7)), 3)
    assert torch.equal(u8(full[2:8, 1:4]), u8(synthetic_region(t, ((2, 8), (1, 4)), 3)))
    nxt = synthetic_region(t, ((0, 9), (0, 7)), 4)
    assert (u8(full) != u8(nxt)).all()  # every byte changes from one step to the next
    assert torch.equal(u8(restep_(t, full.clone(), 3, 4)), u8(nxt))


def test_checkpoint_reads_only_slices(tmp_path):
    from safetensors.torch import save_file

    m = model([("a", (6, 4), "bfloat16"), ("b", (5,), "float32")])
    full = {t.name: synthetic_region(t, tuple((0, n) for n in t.shape), 7) for t in m.tensors}
    save_file(full, str(tmp_path / "model.safetensors"))
    src = CheckpointWeights(m, tmp_path)
    got = materialise(m, {0: (((2, 5), (1, 3)),), 1: (((1, 4),),)}, 0, source=src)
    assert torch.equal(u8(got[0][0]), u8(full["a"][2:5, 1:3].contiguous()))
    assert torch.equal(u8(got[1][0]), u8(full["b"][1:4].contiguous()))
    src.close()


# ---- packing --------------------------------------------------------------------------------------
def test_region_not_held_and_bad_sizes_are_errors():
    m = model([("x", (4, 4), "float32")])
    w = LocalWeights(m, {0: (((0, 2), (0, 4)),)}, materialise(m, {0: (((0, 2), (0, 4)),)}, 1))
    with pytest.raises(TransferError, match="holds 8 of its 16"):
        w.read_into(0, ((0, 4), (0, 4)), torch.empty(64, dtype=torch.uint8))
    with pytest.raises(TransferError, match="nbytes 30"):
        link_offsets(m, (Region(0, ((0, 2), (0, 4)), 30),))


def test_a_plan_that_leaves_a_gap_or_writes_twice_is_refused_before_posting():
    """The program checks, once, that the plan writes every element an inference rank holds exactly once."""
    from reshardctl.runtime.program import compile_program

    m = model([("x", (4, 4), "float32")])
    src = {0: {0: (((0, 4), (0, 4)),)}}
    dst = {0: {0: (((0, 4), (0, 4)),)}}
    plan = p2p_plan(m, src, dst)
    compile_program(plan, 1)  # the good plan compiles
    r = plan.steps[1][0]
    half = (Region(0, ((0, 2), (0, 4)), 32),)
    twice = (Region(0, ((0, 2), (0, 4)), 32), Region(0, ((1, 3), (0, 4)), 32))  # 16 of 16, one row twice
    for regions, why in ((half, "8 of 16"), (twice, "written twice")):
        steps = {0: (P2PRound(r.index, 1, (PeerRegions(1, regions),), ()),),
                 1: (P2PRound(r.index, 1, (), (PeerRegions(0, regions),)),)}
        bad = StaticPlan(m, 1, 1, "reshard", "x", 1 << 20, steps, src, dst)
        with pytest.raises(TransferError, match=why):
            compile_program(bad, 1)


def test_buffer_pool_reuses_and_tracks_peak():
    pool = BufferPool(torch.device("cpu"))
    a = pool.acquire(1000)
    b = pool.acquire(500)
    assert pool.peak == 1500
    pool.release(a)
    c = pool.acquire(900)
    assert c.data_ptr() == a.data_ptr() and pool.peak == 1500
    pool.release(b), pool.release(c)
    assert pool.in_use == 0


# ---- plans, events, faults --------------------------------------------------------------------------
def test_hand_plans_satisfy_the_protocol_and_mirror():
    m, src, dst = rows_cols_case()
    for plan in (p2p_plan(m, src, dst), p2p_plan(m, src, dst, per_tensor_rounds=True),
                 bucket_plan(m, src, dst, [[0, 1], [2, 3]])):
        assert isinstance(plan, ExecutablePlan)
        assert mirror_problems(plan.steps) == []
    m, src, dst, relay = relay_case()
    plan = p2p_plan(m, src, dst, relay=relay)
    assert any(s.stage == 2 for s in plan.steps_for(3))
    import pickle

    again = pickle.loads(pickle.dumps(plan))
    assert again.steps_for(3) == plan.steps_for(3) and again.model.tensors == plan.model.tensors


def test_mismatched_plan_is_refused_before_posting():
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst)
    steps = dict(plan.steps)
    r0 = steps[2][0]
    steps[2] = (type(r0)(r0.index, r0.stage, r0.sends, r0.recvs[:1]),)  # rank 2 forgets rank 1's message
    with pytest.raises(TransferError, match="expects nothing"):
        StaticPlan(m, 2, 2, "reshard", "x", 1 << 20, steps, src, dst)  # refused when built (or unpickled)


def test_events_record_success_and_failure(tmp_path):
    log = EventLog(tmp_path, 3, "infer")
    with log.phase("round/transfer", round=2, bytes=10, peers=[0, 1]) as extra:
        extra["note"] = "x"
    with pytest.raises(ValueError):
        with log.phase("verify"):
            raise ValueError("boom")
    log.close()
    ev = read_events(tmp_path / "events" / "rank-3.jsonl")
    assert [e["phase"] for e in ev] == ["round/transfer", "verify"]
    assert ev[0]["round"] == 2 and ev[0]["peers"] == [0, 1] and ev[0]["note"] == "x" and ev[0]["duration_s"] >= 0
    assert ev[1]["error_type"] == "ValueError" and ev[1]["error"] == "boom" and ev[1]["side"] == "infer"
    json.dumps(ev)


def test_drill_specs_and_the_corruption_tap():
    f = parse_faults("corrupt:rank=2:step=3;kill:rank=5:phase=transfer;slow:rank=1,factor=4")
    assert [(x.kind, x.rank, x.phase, x.step) for x in f] == [("corrupt", 2, "transfer", 3),
                                                              ("kill", 5, "transfer", None), ("slow", 1, "transfer", None)]
    assert f[2].factor == 4.0 and parse_faults("exit:rank=3")[0].phase == "commit"
    assert parse_faults("hang:rank=2")[0].phase == "verify"
    drills = Drills(f, 2)
    b = torch.zeros(16, dtype=torch.uint8)
    assert not drills.corrupt(2, b, 16)
    assert drills.corrupt(3, b, 16) and b.sum() > 0
    assert not drills.corrupt(3, b, 16)  # once
    assert Drills(f, 1).slow_factor(1) == 4.0
    for bad in ("explode:rank=1", "kill:rank=x", "kill:phase=commit", "kill:rank=1:when=now"):
        with pytest.raises(InputError):
            parse_faults(bad)


# ---- zero copy: contiguous spans and the wire split ---------------------------------------------------
def test_contiguous_span_matches_the_row_major_offset():
    from reshardctl.runtime.wire import contiguous_span

    boxes = (((0, 4), (0, 6)), ((4, 8), (2, 6)))
    assert contiguous_span(boxes, ((1, 3), (0, 6)), 2) == (0, 1 * 6 * 2)  # row block
    assert contiguous_span(boxes, ((2, 3), (1, 4)), 2) == (0, (2 * 6 + 1) * 2)  # part of one row
    assert contiguous_span(boxes, ((5, 7), (2, 6)), 4) == (1, 1 * 4 * 4)  # second box
    assert contiguous_span(boxes, ((1, 3), (0, 3)), 2) is None  # column slice of several rows
    assert contiguous_span(boxes, ((3, 5), (2, 6)), 2) is None  # spans two boxes
    assert contiguous_span(((),), (), 4) == (0, 0)  # scalar
    t3 = (((0, 4), (0, 3), (0, 2)),)
    assert contiguous_span(t3, ((1, 2), (1, 3), (0, 2)), 1) == (0, (1 * 6 + 1 * 2))
    assert contiguous_span(t3, ((1, 3), (1, 3), (0, 2)), 1) is None
    # the span is exactly the bytes of the box (cross-check against torch indexing)
    full = torch.arange(4 * 6, dtype=torch.int16).view(4, 6)
    _k, off = contiguous_span((((0, 4), (0, 6)),), ((2, 3), (1, 5)), 2)
    assert torch.equal(u8(full).reshape(-1)[off : off + 8], u8(full[2:3, 1:5].contiguous()).reshape(-1))


def test_messages_land_in_place_where_the_arena_lays_a_link_out_back_to_back():
    """One message per link; a rank's arena follows its program's first use, so a link of whole boxes is
    one contiguous range of it (zero copy); a column slice is not (staging)."""
    from reshardctl.runtime.executor import arena_place
    from reshardctl.runtime.program import compile_program

    m, src, dst = zero_copy_case()
    plan = p2p_plan(m, src, dst)
    for rank in range(4):
        prog = compile_program(plan, rank)
        holdings = prog.holdings
        w = LocalWeights.in_arena(m, holdings, "cpu", order=prog.order)
        msgs = [m for s in prog.steps for x in s.sends + s.recvs for m in x.messages]
        assert sum(prog.out_messages.values()) + sum(prog.in_messages.values()) == len(msgs)
        for x in msgs:
            at = arena_place(w, x)
            if at is not None:  # the place is right: every region's bytes are where the message puts them
                for r, o in zip(x.regions, x.offsets):
                    want = torch.zeros(r.nbytes, dtype=torch.uint8)
                    w.arena[at + o : at + o + r.nbytes] = torch.arange(r.nbytes, dtype=torch.int64).remainder(251).to(torch.uint8)
                    w.read_into(r.tensor, r.box, want)
                    assert torch.equal(want, w.arena[at + o : at + o + r.nbytes])
    # on the receivers: the regions contiguous there (w.eq, w.rc) land in place, the others go through staging
    for r in (2, 3):
        prog = compile_program(plan, r)
        w = LocalWeights.in_arena(m, prog.holdings, "cpu", order=prog.order)
        for x in (x for s in prog.steps for y in s.recvs for x in y.messages):
            names = {m.tensors[q.tensor].name for q in x.regions}
            assert (arena_place(w, x) is not None) == (names <= {"w.eq", "w.rc"}), names
    # without an arena (an RL framework's own tensors) nothing is placed
    prog = compile_program(plan, 2)
    plain = LocalWeights(m, prog.holdings, materialise(m, prog.holdings, 1))
    assert all(arena_place(plain, x) is None for s in prog.steps for y in s.recvs for x in y.messages)


# ---- two-phase commit: agreement on the committed step ----------------------------------------------
def test_agreement_finds_the_ranks_ahead():
    from reshardctl.runtime.commit import agree

    assert agree([None, None, 4, 4], 2) == (4, [])
    assert agree([None, None, 4, 5], 2) == (4, [3])
    assert agree([None, None, None, 5], 2) == (None, [3])  # a rank with nothing committed is the lowest
    assert agree([7, 9, None, None], 2) == (None, [])  # trainers hold no committed weights


def test_a_rank_ahead_rolls_back_to_the_previous_weights_it_holds(monkeypatch, tmp_path):
    """The acknowledgement completed on rank 3 but not on rank 2 (a partial completion a real system
    cannot produce on demand: the all-reduce is faked here). At the next common start rank 3 swaps back
    to the step-1 weights it still holds, so both serve step 1; a rank that no longer holds them raises."""
    from types import SimpleNamespace

    from reshardctl.runtime import commit as _commit
    from reshardctl.runtime.refit import State, common_start

    m = model([("w", (4, 4), "float32")])
    h = {0: (((0, 4), (0, 4)),)}
    old, new = materialise(m, h, 1), materialise(m, h, 2)
    st = State(current=LocalWeights(m, h, new), staged=LocalWeights(m, h, old), committed_step=2,
               previous_step=1, previous_valid=True)
    env = SimpleNamespace(global_rank=3, side="infer", world_size=4)
    groups = SimpleNamespace(env=env)
    monkeypatch.setattr(_commit, "gather_steps", lambda g, extra, mine: ([1, 1, 1, 1], [None, None, 1, 2]))
    log = EventLog(tmp_path, 3, "infer")
    common_start(groups, st, 2, 3, None, log)
    assert st.committed_step == 1 and not st.previous_valid
    assert torch.equal(u8(st.current.data[0][0]), u8(old[0][0]))
    st2 = State(current=LocalWeights(m, h, new), staged=LocalWeights(m, h, old), committed_step=2,
                previous_step=1, previous_valid=False)
    with pytest.raises(TransferError, match="disagree on the committed step"):
        common_start(groups, st2, 2, 3, None, log)
    log.close()
    assert any(e["phase"] == "rollback" for e in read_events(tmp_path / "events" / "rank-3.jsonl"))


def test_when_the_executor_drains_pending_steps():
    """A relay drains before packing a stage-2 round; with NCCL a bucket step never overlaps another
    step (one communicator at a time); on gloo rounds and buckets overlap one deep."""
    from reshardctl.runtime.executor import must_drain
    from reshardctl.runtime.program import BucketOps, RoundOps

    send_round = RoundOps(3, 2, sends=("x",), recvs=(), peers=(1,))
    recv_round = RoundOps(4, 1, sends=(), recvs=("y",), peers=(1,))
    bucket = BucketOps(None, None, {}, (), (), (), (), (), True)
    assert must_drain(send_round, ["round"], is_infer=True, one_communicator=False)  # relay
    assert not must_drain(send_round, ["round"], is_infer=False, one_communicator=False)  # trainer
    assert not must_drain(recv_round, ["round"], is_infer=True, one_communicator=True)  # same communicator
    assert must_drain(bucket, ["round"], is_infer=False, one_communicator=True)
    assert must_drain(recv_round, ["bucket"], is_infer=True, one_communicator=True)
    assert not must_drain(bucket, ["round"], is_infer=False, one_communicator=False)  # gloo overlaps
    assert not must_drain(recv_round, ["bucket"], is_infer=True, one_communicator=False)
