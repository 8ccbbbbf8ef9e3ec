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
