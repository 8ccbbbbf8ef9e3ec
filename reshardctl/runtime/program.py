"""One rank's program: everything it does at every refit, derived once from the plan.

``compile_program(plan, rank)`` reads only this rank's steps (``steps_for``: one vectorised pass over
the plan's round tables) and its own holding, and peers' boxes tensor by tensor: it never builds
another rank's steps or holding, so its cost does not grow with the world (benchmarks/rank_setup.py:
the same at 64 + 64 and 512 + 512). For
every step it fixes the links (one message per peer and step, wire.py), the bucket layouts and what
this rank unpacks, how many checksums each peer sends and expects (one per message), and the order in
which this rank first uses its boxes (its arena's order, arena.py). It checks, once, that the plan
writes every element this rank holds exactly once (a plan that does not is refused before anything is
posted). Plan-level facts every rank needs (the broadcast groups, the mirror check) come with the
plan (``plan.broadcast_groups()``; mirror.py), not from walking other ranks' steps.

The executor replays the same program at every refit: no plan walk, no per-region object or string
per refit (region names are made only to report a mismatch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from reshardctl.errors import TransferError
from reshardctl.gc_pause import few_collections
from reshardctl.layout.indexset import intersect_boxes
from reshardctl.layout.placement import Box, box_numel, full_box
from reshardctl.plan.schedule import BroadcastBucket, P2PRound, Region
from reshardctl.runtime.bucket_format import bucket_layout
from reshardctl.runtime.local_weights import norm_box
from reshardctl.runtime.wire import Layout, contiguous_span, first_box, link_offsets, place, split_link
from reshardctl.topology import infer_rank_of, is_trainer


@dataclass(frozen=True)
class Message:
    """Regions back to back at ``offsets`` (``nbytes`` in all)."""

    regions: tuple[Region, ...]
    offsets: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Link:
    """This rank's messages with one peer in one step (at most four, wire.py)."""

    peer: int
    messages: tuple[Message, ...]

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.messages)


@dataclass(frozen=True)
class RoundOps:
    index: int
    stage: int
    sends: tuple[Link, ...]
    recvs: tuple[Link, ...]
    peers: tuple[int, ...]


@dataclass(frozen=True)
class BucketOps:
    bucket: BroadcastBucket
    layout: Layout
    pos: dict[int, int]
    sends: tuple[Link, ...]  # a non-root trainer's pieces to the root
    recvs: tuple[Link, ...]  # at the root: the other trainers' pieces
    own: tuple[Region, ...]  # at the root: its own pieces, copied locally
    recv_at: tuple[tuple[int | None, ...], ...]  # at the root: where each received message lies in the bucket
    held: tuple[tuple[int, int, tuple[Box, ...]], ...]  # an inference member: (position, tensor, its boxes)
    member: bool  # receives the broadcast (in the group, not the root)

    @property
    def index(self) -> int:
        return self.bucket.index


@dataclass
class RankProgram:
    rank: int
    is_infer: bool
    holdings: dict[int, tuple[Box, ...]]
    steps: tuple[RoundOps | BucketOps, ...]
    out_messages: dict[int, int]  # peer -> messages (= checksums) this rank sends it per refit
    in_messages: dict[int, int]
    order: tuple[tuple[int, int], ...]  # (tensor, box number) in first-use order: the arena's order
    compile_s: float = 0.0
    counts: dict = field(default_factory=dict)


def compile_program(plan, rank: int) -> RankProgram:
    with few_collections():  # its regions, links and messages live on (gc_pause.py)
        return _compile(plan, rank)


def _compile(plan, rank: int) -> RankProgram:
    t0 = time.perf_counter()
    model = plan.model
    T = plan.train_world
    is_infer = not is_trainer(rank, T)
    holdings = dict(plan.dst_holdings(infer_rank_of(rank, T)) if is_infer else plan.src_holdings(rank))
    out_messages: dict[int, int] = {}
    in_messages: dict[int, int] = {}
    counts = {"steps": 0, "p2p_messages": 0, "broadcasts": 0, "regions": 0}
    written: dict[int, list[Box]] = {}  # tensor -> the boxes the plan writes into this rank's copy
    order: dict[tuple[int, int], None] = {}

    def use(regions) -> None:
        for r in regions:
            boxes = holdings.get(r.tensor, ())
            k = 0 if len(boxes) == 1 else first_box(boxes, r.box)
            if k is not None:
                order.setdefault((r.tensor, k), None)

    contig_memo: dict = {}
    keep: list = []  # the boxes tuples keyed by id in contig_memo stay alive
    numel_memo: dict = {}

    def contiguous(boxes, box, isz) -> bool:
        key = (id(boxes), box, isz)
        got = contig_memo.get(key)
        if got is None:
            got = contig_memo[key] = contiguous_span(boxes, box, isz) is not None
            keep.append(boxes)
        return got

    def numel(box) -> int:
        got = numel_memo.get(box)
        if got is None:
            got = numel_memo[box] = box_numel(box)
        return got

    def link(peer: int, regions: tuple[Region, ...], sending: bool, into=None) -> Link:
        sender, receiver = (rank, peer) if sending else (peer, rank)
        src_boxes = lambda t: plan.boxes_of(sender, t)  # noqa: E731
        dst_boxes = into if into is not None else (lambda t: plan.boxes_of(receiver, t))
        msgs = []
        for group in split_link(model, regions, src_boxes, dst_boxes, contiguous):
            offsets, n = link_offsets(model, group, numel)
            msgs.append(Message(group, offsets, n))
        counts["p2p_messages"] += len(msgs)
        counts["regions"] += len(regions)
        book = out_messages if sending else in_messages
        book[peer] = book.get(peer, 0) + len(msgs)
        return Link(peer, tuple(msgs))

    steps: list[RoundOps | BucketOps] = []
    try:
        for s in plan.steps_for(rank):
            counts["steps"] += 1
            if isinstance(s, P2PRound):
                recvs = tuple(link(p.peer, p.regions, False) for p in s.recvs)
                for x in recvs:
                    for m in x.messages:
                        use(m.regions)
                        for r in m.regions:
                            written.setdefault(r.tensor, []).append(norm_box(r.box))
                sends = tuple(link(p.peer, p.regions, True) for p in s.sends)
                for x in sends:
                    for m in x.messages:
                        use(m.regions)
                steps.append(RoundOps(s.index, s.stage, sends, recvs,
                                      tuple(sorted({x.peer for x in sends + recvs}))))
            elif isinstance(s, BroadcastBucket):
                steps.append(_bucket_ops(plan, s, rank, link, counts, written, use))
            else:
                raise TransferError(f"unknown step type {type(s).__name__}")
    except TransferError as exc:
        raise TransferError(f"rank {rank}: plan messages: {exc.message}", hint=exc.hint) from exc
    if is_infer:
        _check_coverage(model, rank, holdings, written)
    counts["checksum_messages"] = len(out_messages) + len(in_messages)
    return RankProgram(rank, is_infer, holdings, tuple(steps), out_messages, in_messages, tuple(order),
                       time.perf_counter() - t0, counts)


def _bucket_ops(plan, b: BroadcastBucket, rank: int, link, counts, written, use) -> BucketOps:
    model = plan.model
    lay = bucket_layout(model, b.tensors)
    if lay.payload != b.nbytes:
        raise TransferError(f"bucket {b.index}: tensors hold {lay.payload} B but the plan says {b.nbytes} B")
    pos = {t: k for k, t in enumerate(b.tensors)}
    sends: tuple[Link, ...] = ()
    recvs: tuple[Link, ...] = ()
    own: tuple[Region, ...] = ()
    recv_at: tuple = ()
    if rank == b.root:
        _check_bucket_cover(model, b)
        full = {t: (full_box(model.tensors[t].shape),) for t in b.tensors}
        recvs = tuple(link(g.peer, g.regions, False, full.__getitem__) for g in b.gather if g.peer != rank)
        starts = {(t, 0): lay.offsets[k] for k, t in enumerate(b.tensors)}
        recv_at = tuple(tuple(place(model, full, starts, m.regions, m.offsets) for m in x.messages) for x in recvs)
        own = tuple(r for g in b.gather if g.peer == rank for r in g.regions)
        use(own)
    else:
        full = {t: (full_box(model.tensors[t].shape),) for t in b.tensors}
        sends = tuple(link(b.root, g.regions, True, full.__getitem__) for g in b.gather if g.peer == rank)
        for x in sends:
            for m in x.messages:
                use(m.regions)
    member = rank in b.group and rank != b.root
    held: tuple = ()
    if member and not is_trainer(rank, plan.train_world):
        held = tuple((k, t, tuple(plan.boxes_of(rank, t))) for k, t in enumerate(b.tensors) if plan.boxes_of(rank, t))
        for _, t, boxes in held:
            written.setdefault(t, []).extend(norm_box(x) for x in boxes)
            use(Region(t, x, 0) for x in boxes)
    if member or rank == b.root:
        counts["broadcasts"] += 1
    return BucketOps(b, lay, pos, sends, recvs, own, recv_at, held, member)


def _check_bucket_cover(model, b: BroadcastBucket) -> None:
    got = {t: 0 for t in b.tensors}
    for g in b.gather:
        for r in g.regions:
            if r.tensor in got:
                got[r.tensor] += box_numel(r.box)
    short = [f"{model.tensors[t].name}: {n} of {model.tensors[t].numel} elements"
             for t, n in got.items() if n != model.tensors[t].numel]
    if short:
        raise TransferError(f"bucket {b.index}: the gather does not cover the bucket: " + "; ".join(short[:5]))


def _check_coverage(model, rank: int, holdings: dict, written: dict) -> None:
    """Every element of every box this inference rank holds is written exactly once per refit."""
    problems = []
    for t, boxes in holdings.items():
        got_boxes = written.get(t, ())
        if len(boxes) == 1 and len(got_boxes) == 1 and got_boxes[0] == norm_box(boxes[0]):
            continue  # the common case: the whole box in one region
        for box in boxes:
            nb = norm_box(box)
            parts = [i for p in written.get(t, ()) for i in [intersect_boxes(p, nb)] if i is not None]
            got, want = sum(box_numel(p) for p in parts), box_numel(nb)
            overlap = None
            if got == want and 1 < len(parts) <= 256:
                overlap = next(((p, q) for a, p in enumerate(parts) for q in parts[a + 1 :]
                                if intersect_boxes(p, q)), None)
            if got != want or overlap:
                why = f"written twice: {overlap}" if overlap else f"{got} of {want} elements written"
                problems.append(f"{model.tensors[t].name} box {box}: {why}")
    if problems:
        raise TransferError(
            f"rank {rank}: the plan does not write every element this rank holds exactly once "
            f"({len(problems)} boxes): " + "; ".join(problems[:5]),
            hint="the plan is inconsistent with the inference layout; nothing was posted")
