"""The per-rank program (runtime/program.py) on random planner plans: both ends of every link compute
the same messages (sizes, order) from the plan alone, the message counts each peer expects match, the
planner's steps are mirrored, every inference rank's holding is written exactly once, and a rank's
arena lays its in-place messages out exactly where their bytes belong."""

from __future__ import annotations

import torch
from hypothesis import given, settings

from reshardctl.plan.model import TRANSPORTS
from reshardctl.plan.planner import build_plan
from reshardctl.runtime.executor import arena_place
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.mirror import mirror_problems
from reshardctl.runtime.program import BucketOps, RoundOps, compile_program
from reshardctl.runtime.synthetic_weights import SyntheticWeights

from test_planner_properties import SETTINGS, SCALE, scenarios


def _messages(prog, direction: str):
    """(step index, peer) -> message sizes, in posting order, for one direction."""
    out = {}
    for s in prog.steps:
        links = s.sends if direction == "out" else s.recvs
        kind = "r" if isinstance(s, RoundOps) else "g"
        for x in links:
            out[(kind, s.index, x.peer)] = [m.nbytes for m in x.messages]
    return out


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(scenarios(), __import__("hypothesis").strategies.sampled_from(TRANSPORTS),
       __import__("hypothesis").strategies.booleans())
def test_both_ends_of_every_link_agree_on_its_messages(s, transport, relay):
    model, train, infer, topo, bucket = s
    plan = build_plan(model, train, infer, topo, transport=transport, bucket_bytes=bucket, relay=relay)
    world = plan.train_world + plan.infer_world
    assert mirror_problems({r: plan.steps_for(r) for r in range(world)}) == []
    progs = {r: compile_program(plan, r) for r in range(world)}  # also: every holding written exactly once
    for r, prog in progs.items():
        for (kind, idx, peer), sizes in _messages(prog, "out").items():
            theirs = _messages(progs[peer], "in").get((kind, idx, r))
            assert theirs == sizes, (kind, idx, r, peer)
        for peer, n in prog.out_messages.items():
            assert progs[peer].in_messages[r] == n
        assert sum(prog.out_messages.values()) == sum(len(x.messages) for st in prog.steps for x in st.sends)
        assert all(len(x.messages) <= 4 for st in prog.steps for x in st.sends + st.recvs)
        assert all(isinstance(st, (RoundOps, BucketOps)) for st in prog.steps)


@settings(max_examples=25 * SCALE, **SETTINGS)
@given(scenarios())
def test_an_in_place_message_is_exactly_the_bytes_of_its_regions(s):
    """Where a message lies back to back in a rank's arena, the arena range holds its regions' bytes in
    message order (read independently through the boxes)."""
    model, train, infer, topo, bucket = s
    plan = build_plan(model, train, infer, topo, transport="reshard", bucket_bytes=bucket, relay=True)
    source = SyntheticWeights(model)
    for r in range(plan.train_world + plan.infer_world):
        prog = compile_program(plan, r)
        w = LocalWeights.in_arena(model, prog.holdings, "cpu", lambda i, b: source.region(i, b, 3),
                                  order=prog.order)
        for st in prog.steps:
            for x in st.sends + st.recvs:
                for m in x.messages:
                    at = arena_place(w, m)
                    if at is None:
                        continue
                    for reg, o in zip(m.regions, m.offsets):
                        want = torch.empty(reg.nbytes, dtype=torch.uint8)
                        w.read_into(reg.tensor, reg.box, want)
                        assert torch.equal(w.arena[at + o : at + o + reg.nbytes], want)


@settings(max_examples=25 * SCALE, **SETTINGS)
@given(scenarios())
def test_the_indexed_copy_of_a_staged_message_equals_region_by_region_copies(s):
    """span_copy: where a staged message's regions are contiguous ranges of the arena, one indexed
    gather gives exactly the bytes of region-by-region copies, and one indexed scatter writes them
    exactly where region-by-region writes would (nothing else in the arena changes)."""
    from reshardctl.runtime import span_copy

    model, train, infer, topo, bucket = s
    plan = build_plan(model, train, infer, topo, transport="reshard", bucket_bytes=bucket, relay=True)
    source = SyntheticWeights(model)
    old = span_copy.MIN_CHUNK
    span_copy.MIN_CHUNK = 1  # toy tensors: let every message qualify
    try:
        for r in range(plan.train_world + plan.infer_world):
            prog = compile_program(plan, r)
            w = LocalWeights.in_arena(model, prog.holdings, "cpu", lambda i, b: source.region(i, b, 3),
                                      order=prog.order)
            for st in prog.steps:
                for x in st.sends + st.recvs:
                    for m in x.messages:
                        cp = span_copy.chunk_index(w, m.regions, torch.device("cpu"))
                        if cp is None:
                            continue
                        want = torch.empty(m.nbytes, dtype=torch.uint8)
                        for reg, o in zip(m.regions, m.offsets):
                            w.read_into(reg.tensor, reg.box, want[o : o + reg.nbytes])
                        got = torch.empty(m.nbytes, dtype=torch.uint8)
                        span_copy.gather(w.arena, cp[0], cp[1], got)
                        assert torch.equal(got, want)
                        before = w.arena.clone()
                        new = torch.arange(m.nbytes, dtype=torch.int64).remainder(253).to(torch.uint8)
                        span_copy.scatter(w.arena, cp[0], cp[1], new)
                        ref = LocalWeights.in_arena(model, prog.holdings, "cpu", order=prog.order)
                        ref.arena.copy_(before)
                        for reg, o in zip(m.regions, m.offsets):
                            ref.write_from(reg.tensor, reg.box, new[o : o + reg.nbytes])
                        assert torch.equal(w.arena, ref.arena)
    finally:
        span_copy.MIN_CHUNK = old


def test_the_indexed_copy_is_not_used_for_column_slices_or_tiny_chunks():
    from reshardctl.runtime import span_copy
    from runtime_plans import model as hand_model

    m = hand_model([("a", (8, 64), "float32"), ("b", (8, 64), "float32")])
    h = {0: (((0, 8), (0, 64)),), 1: (((0, 8), (0, 64)),)}
    w = LocalWeights.in_arena(m, h, "cpu")
    from reshardctl.plan.schedule import Region

    rows = (Region(0, ((0, 4), (0, 64)), 1024), Region(1, ((4, 8), (0, 64)), 1024))
    cols = (Region(0, ((0, 8), (0, 32)), 1024), Region(1, ((0, 8), (32, 64)), 1024))
    assert span_copy.chunk_index(w, rows, torch.device("cpu"))[0] >= span_copy.MIN_CHUNK
    assert span_copy.chunk_index(w, cols, torch.device("cpu")) is None  # strided: region by region
    odd = (Region(0, ((0, 1), (0, 3)), 12), Region(1, ((0, 1), (0, 3)), 12))
    assert span_copy.chunk_index(w, odd, torch.device("cpu")) is None  # 12-byte ranges: too small a chunk
