"""The per-rank program (runtime/program.py) on random planner plans: both ends of every link compute
the same messages (sizes, order) from the plan alone, the message counts each peer expects match, the
planner's steps are mirrored, every inference rank's holding is written exactly once, and a rank's
arena lays its in-place messages out exactly where their bytes belong."""

from __future__ import annotations

import torch
from hypothesis import given, settings

from reshardctl.plan.refit_plan import TRANSPORTS
from reshardctl.plan.planner import build_plan
from reshardctl.runtime.executor import arena_place
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.mirror import mirror_problems
from reshardctl.runtime.program import BucketOps, RoundOps, compile_program
from reshardctl.runtime.synthetic_weights import SyntheticWeights

from helpers.planner_scenarios import SETTINGS, SCALE, scenarios


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
    for _prog, w, m in _every_message(s):
        at = arena_place(w, m)
        if at is None:
            continue
        for reg, o in zip(m.regions, m.offsets):
            want = torch.empty(reg.nbytes, dtype=torch.uint8)
            w.read_into(reg.tensor, reg.box, want)
            assert torch.equal(w.arena[at + o : at + o + reg.nbytes], want)


def _every_message(s):
    """(program, arena weights, message) for every message of every rank of the scenario's reshard plan
    (relays on), each rank's weights filled with step-3 synthetic values in its program's arena order."""
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
                    yield prog, w, m


def _check_message_copy(w, regions, offsets, nbytes, spec, fresh):
    """``spec``'s copy of a message equals region-by-region copies byte for byte: packing (arena ->
    block) and landing (block -> arena, nothing else in the arena changes)."""
    from reshardctl.runtime import span_copy

    mc = span_copy.MessageCopy(spec, w.arena.device)
    want = torch.empty(nbytes, dtype=torch.uint8)
    for reg, o in zip(regions, offsets):
        w.read_into(reg.tensor, reg.box, want[o : o + reg.nbytes])
    got = torch.full((nbytes,), 7, dtype=torch.uint8)
    mc.gather(w, got)
    assert torch.equal(got, want), spec
    odd = torch.full((nbytes + 1,), 7, dtype=torch.uint8)[1:]  # a block view at an odd start: bytes, not words
    mc.gather(w, odd)
    assert torch.equal(odd, want), spec
    before = w.arena.clone()
    new = torch.arange(nbytes, dtype=torch.int64).remainder(253).to(torch.uint8)
    mc.scatter(w, new)
    ref = fresh()
    ref.arena.copy_(before)
    for reg, o in zip(regions, offsets):
        ref.write_from(reg.tensor, reg.box, new[o : o + reg.nbytes])
    assert torch.equal(w.arena, ref.arena), spec
    w.arena.copy_(before)
    src_odd = torch.empty(nbytes + 1, dtype=torch.uint8)[1:]
    src_odd.copy_(new)
    mc.scatter(w, src_odd)
    assert torch.equal(w.arena, ref.arena), spec
    w.arena.copy_(before)


@settings(max_examples=25 * SCALE, **SETTINGS)
@given(scenarios(), __import__("hypothesis").strategies.sampled_from([1, 256]))
def test_the_indexed_copy_of_a_staged_message_equals_region_by_region_copies(s, min_chunk):
    """span_copy on planner plans: every staged message's copy (one indexed copy, or strided views,
    column slices included) gives exactly the bytes of region-by-region copies, and writes them exactly
    where region-by-region writes would (nothing else in the arena changes)."""
    from reshardctl.runtime import span_copy

    model = s[0]
    old = span_copy.MIN_CHUNK
    span_copy.MIN_CHUNK = min_chunk  # 1: toy tensors, let the index apply wherever the layout allows
    try:
        for prog, w, m in _every_message(s):
            if arena_place(w, m) is not None:
                continue
            spec = span_copy.copy_spec(w, m.regions, m.offsets)
            if spec is not None:
                _check_message_copy(w, m.regions, m.offsets, m.nbytes, spec,
                                    lambda: LocalWeights.in_arena(model, prog.holdings, "cpu", order=prog.order))
    finally:
        span_copy.MIN_CHUNK = old


@settings(max_examples=150 * SCALE, **SETTINGS)
@given(__import__("hypothesis").strategies.data())
def test_strided_and_indexed_copies_of_random_boxes_equal_region_by_region(data):
    """Hand-made arenas: 1-D to 3-D boxes of 1-, 2-, 4- and 8-byte items at adversarial (odd) arena
    offsets, split into two boxes per tensor at random; messages of random sub-boxes (column slices,
    3-D slabs, rows, single elements, regions spanning both boxes) in random order. Whatever copy
    ``copy_spec`` picks (index, strided views, region fallback), and at any MIN_CHUNK, packing and
    landing equal region-by-region copies byte for byte."""
    import hypothesis.strategies as st

    from reshardctl.plan.schedule import Region
    from reshardctl.runtime import span_copy
    from helpers.runtime_plans import model as hand_model

    n = data.draw(st.integers(1, 4), label="tensors")
    dtypes = {1: "uint8", 2: "bfloat16", 4: "float32", 8: "int64"}
    tensors, holdings = [], {}
    for i in range(n):
        isz = data.draw(st.sampled_from([1, 2, 4, 8]))
        shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
        tensors.append((f"t{i}", shape, dtypes[isz]))
        full = tuple((0, s) for s in shape)
        if shape[0] > 1 and data.draw(st.booleans()):  # two boxes, split on the first dimension
            cut = data.draw(st.integers(1, shape[0] - 1))
            holdings[i] = (((0, cut),) + full[1:], ((cut, shape[0]),) + full[1:])
        else:
            holdings[i] = (full,)
    m = hand_model(tensors)
    keys = [(i, k) for i in holdings for k in range(len(holdings[i]))]
    order = data.draw(st.permutations(keys))
    w = LocalWeights.in_arena(m, holdings, "cpu", lambda i, b: torch.randint(
        0, 100, tuple(hi - lo for lo, hi in b)).to(getattr(torch, tensors[i][2])), order=order)
    regions = []
    for _ in range(data.draw(st.integers(1, 8), label="regions")):
        i = data.draw(st.integers(0, n - 1))
        full = tuple((0, s) for s in tensors[i][1])
        if data.draw(st.booleans()):  # the same slice of a tensor: groups of alike regions
            box = full[:-1] + ((0, max(1, full[-1][1] // 2)),)
        else:
            box = tuple(tuple(sorted(data.draw(st.lists(st.integers(lo, hi), min_size=2, max_size=2,
                                                        unique=True)))) for lo, hi in full)
        regions.append(Region(i, box, m.tensors[i].itemsize * __import__("math").prod(b - a for a, b in box)))
    offsets, off = [], 0
    for r in regions:
        offsets.append(off)
        off += r.nbytes
    min_chunk = data.draw(st.sampled_from([1, 2, 8, 256]), label="MIN_CHUNK")
    old = span_copy.MIN_CHUNK
    span_copy.MIN_CHUNK = min_chunk
    try:
        spec = span_copy.copy_spec(w, tuple(regions), tuple(offsets))
        if spec is None:
            return
        fresh = lambda: LocalWeights.in_arena(m, holdings, "cpu", order=order)  # noqa: E731
        if any(r.nbytes for r in regions):
            assert spec.calls <= sum(1 for r in regions if r.nbytes)
        # regions that overlap in the arena would be written twice: landing is only defined without
        overlap = any(a is not b and a.tensor == b.tensor and all(max(x0, y0) < min(x1, y1) for (x0, x1), (y0, y1)
                                                                 in zip(a.box, b.box)) for a in regions for b in regions)
        if overlap:
            mc = span_copy.MessageCopy(spec, w.arena.device)
            want = torch.empty(off, dtype=torch.uint8)
            for reg, o in zip(regions, offsets):
                w.read_into(reg.tensor, reg.box, want[o : o + reg.nbytes])
            got = torch.empty(off, dtype=torch.uint8)
            mc.gather(w, got)
            assert torch.equal(got, want), spec
        else:
            _check_message_copy(w, regions, offsets, off, spec, fresh)
    finally:
        span_copy.MIN_CHUNK = old


def test_column_slices_are_one_strided_copy_per_run_of_alike_regions_or_one_index():
    """The MoE trainer's case: a column slice of every expert's down_proj (a whole [rows, cols] box
    each, boxes equally spaced in the arena) in one message is ONE strided copy (runs below
    MIN_CHUNK) or ONE indexed copy (runs of MIN_CHUNK bytes or more); rows are one indexed copy; a
    region across two boxes falls back to its own copy."""
    from reshardctl.plan.schedule import Region
    from reshardctl.runtime import span_copy
    from helpers.runtime_plans import model as hand_model

    m = hand_model([(f"e{e}", (8, 64), "bfloat16") for e in range(4)] + [("x", (8, 64), "float32")])
    h = {i: (((0, 8), (0, 64)),) for i in range(5)}
    w = LocalWeights.in_arena(m, h, "cpu", lambda i, b: torch.randn(8, 64).to(m.tensors[i].dtype and
                                                                               getattr(torch, m.tensors[i].dtype)))

    def msg(regions):
        offs, o = [], 0
        for r in regions:
            offs.append(o)
            o += r.nbytes
        return tuple(regions), tuple(offs), o

    cols = msg([Region(e, ((0, 8), (16, 32)), 8 * 16 * 2) for e in range(4)])  # 32-byte runs: strided
    spec = span_copy.copy_spec(w, cols[0], cols[1])
    assert spec.kind == "strided" and spec.calls == 1
    assert spec.items[0][3] == (4, 8, 32) and spec.items[0][4] == (1024, 128, 1)
    _check_message_copy(w, *cols, spec, lambda: LocalWeights.in_arena(m, h, "cpu"))
    wide = msg([Region(e, ((0, 8), (0, 32)), 8 * 32 * 2) for e in (0, 2)])  # 64-byte runs, stride 128
    old = span_copy.MIN_CHUNK
    span_copy.MIN_CHUNK = 64
    try:
        spec = span_copy.copy_spec(w, wide[0], wide[1])
        assert spec.kind == "strided" and spec.calls == 1  # a progression of two: one view still
        mixed = msg([Region(0, ((0, 8), (0, 32)), 512), Region(4, ((0, 4), (0, 64)), 1024)])
        spec = span_copy.copy_spec(w, mixed[0], mixed[1])
        assert spec.kind == "index" and spec.g == 64 and spec.calls == 1
        _check_message_copy(w, *mixed, spec, lambda: LocalWeights.in_arena(m, h, "cpu"))
    finally:
        span_copy.MIN_CHUNK = old
    assert span_copy.copy_spec(w, mixed[0], mixed[1]).kind == "strided"  # 64-byte chunks < MIN_CHUNK
    rows = msg([Region(0, ((0, 4), (0, 64)), 512), Region(1, ((4, 8), (0, 64)), 512)])
    spec = span_copy.copy_spec(w, rows[0], rows[1])  # alike, equally spaced: one view of 2 x 512 bytes
    assert spec.kind == "strided" and spec.items[0][3:] == ((2, 512), (1536, 1))
    rows = msg([Region(0, ((0, 4), (0, 64)), 512), Region(1, ((4, 6), (0, 64)), 256)])
    spec = span_copy.copy_spec(w, rows[0], rows[1])  # two ranges: one index of 256-byte chunks
    assert spec.kind == "index" and spec.g == 256 >= span_copy.MIN_CHUNK
    _check_message_copy(w, *rows, spec, lambda: LocalWeights.in_arena(m, h, "cpu"))
    m3 = hand_model([("a", (4, 192), "float16"), ("b", (4, 192), "float16")])
    h3 = {0: (((0, 4), (0, 192)),), 1: (((0, 4), (0, 192)),)}
    w3 = LocalWeights.in_arena(m3, h3, "cpu", lambda i, b: torch.randn(4, 192).half())
    odd = msg([Region(0, ((0, 4), (0, 128)), 1024), Region(1, ((0, 2), (0, 128)), 512)])  # 256 B runs, stride 384
    span_copy.MIN_CHUNK = 128
    try:
        spec = span_copy.copy_spec(w3, odd[0], odd[1])
        assert spec.kind == "index" and spec.g == 128  # the stride bounds the chunk, not only runs and offsets
        _check_message_copy(w3, *odd, spec, lambda: LocalWeights.in_arena(m3, h3, "cpu"))
    finally:
        span_copy.MIN_CHUNK = old
    two = {0: (((0, 4), (0, 64)), ((4, 8), (0, 64)))}
    m2 = hand_model([("a", (8, 64), "float32")])
    w2 = LocalWeights.in_arena(m2, two, "cpu", order=[(0, 1), (0, 0)])
    across = msg([Region(0, ((2, 6), (0, 8)), 128), Region(0, ((0, 2), (0, 8)), 64)])
    spec = span_copy.copy_spec(w2, across[0], across[1])
    assert spec.kind == "strided" and [it[0] for it in spec.items] == ["region", "view"]
    _check_message_copy(w2, *across, spec, lambda: LocalWeights.in_arena(m2, two, "cpu", order=[(0, 1), (0, 0)]))
    assert span_copy.copy_spec(w2, across[0][:1], (0,)) is None  # one region across boxes: as before
