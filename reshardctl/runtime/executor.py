"""Execute one rank's steps of a plan: point-to-point rounds and gather-and-broadcast buckets.

Every step is split in two: ``start`` (pack / gather, then post the asynchronous transfer) and
``finish`` (wait, unpack into the *staged* inference weights). With ``overlap`` the runtime starts
step k+1 before finishing step k, so packing (or the next bucket's gather) runs while the previous
transfer is in flight; an inference relay drains everything pending before it packs a stage-2 round
from its staged copy.

Zero copy (``pack.Wire``): per peer and round, a large region that is a contiguous byte range of the
sender's box is sent straight from the box tensor, and one contiguous in the receiver's staged box
is received straight into it; the rest is coalesced into one packed message. Several messages to one
peer are posted in the same (plan-derived) order on both sides; every size comes from the plan and
the messages of every (round, pair) are computed, and cross-checked with the peers' steps, when the
executor is built (a gloo size mismatch aborts the process instead of raising).

Checksums are off the data path: messages carry payload only. Senders sum every region in their
weights where it is contiguous there, else in its packed copy (one pass per message); receivers sum
every region where it finally lies (read back from the staged weights or the bucket), and local copies
(a bucket root's own pieces, bucket -> staged weights) are compared byte for byte. The sums travel and
are compared in the verify phase, on the control plane, before the vote (``checksum_exchange.py``;
coverage table in docs/checksums.md).
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.layout.placement import box_numel
from reshardctl.plan.schedule import BroadcastBucket, P2PRound, Step
from reshardctl.runtime.checksum import checksum
from reshardctl.runtime.checksum_exchange import ChecksumExchange
from reshardctl.runtime.message_io import MessageIO
from reshardctl.runtime.events import EventLog
from reshardctl.runtime.groups import Abandoned, Groups, wait_works
from reshardctl.runtime.mirror import check_mirror
from reshardctl.runtime.pack import (
    DIRECT_MIN_BYTES,
    BucketTarget,
    BufferPool,
    FullBoxes,
    LocalWeights,
    Wire,
    box_bytes_in,
    bucket_layout,
    bucket_tensor_view,
    item_checksums,
    trailer_view,
    wire_of,
    write_trailer,
)
from reshardctl.topology import infer_rank_of, is_trainer


_TAG_ROUND, _TAG_GATHER = 0, 1


def _tag(index: int, kind: int) -> int:
    return index * 4 + kind


@dataclass
class ExecStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    wire_bytes: int = 0
    steps: int = 0


@dataclass
class _Pending:
    """What ``finish`` needs: the posted works and the buffers to verify/unpack/release."""

    kind: str
    index: int
    works: list = field(default_factory=list)
    posted_at: float = 0.0
    posted_unix: float = 0.0
    wire: int = 0
    peers: list[int] = field(default_factory=list)
    recvs: list = field(default_factory=list)  # (PeerRegions, Layout, view)
    blocks: list[torch.Tensor] = field(default_factory=list)  # pool blocks to release
    bucket: tuple | None = None  # (BroadcastBucket, Layout, view) for a receiving group member
    keep: list = field(default_factory=list)  # small tensors (checksum vectors) alive until the wait


class Executor(MessageIO, ChecksumExchange):
    def __init__(self, plan, groups: Groups, events: EventLog, pool: BufferPool, *, tap=None,
                 overlap: bool = True, direct_min: int = DIRECT_MIN_BYTES):
        """``tap(step, buf, nbytes)``: called with the first bytes that landed from each peer before they
        are checked (the worker's fault drills use it to corrupt them); None in the API."""
        self.plan = plan
        self.model = plan.model
        self.env = groups.env
        self.rank = self.env.global_rank
        self.groups = groups
        self.events = events
        self.pool = pool
        self.tap = tap
        self.overlap = overlap
        self.steps = plan.steps_for(self.rank)
        self.is_infer = self.env.side == "infer"
        self.dst = plan.dst_holdings(self.env.side_rank) if self.is_infer else {}
        self.device = groups.device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.checks: list[tuple[torch.Tensor, list[str]]] = []
        # this refit's checksums, per peer, in plan order: a 0-d tensor, or a contiguous view still to sum
        self.out_sums: dict[int, list[torch.Tensor]] = {}
        self.in_sums: dict[int, list[tuple[torch.Tensor, str]]] = {}  # (int64 sum, or uint8 view to sum; what)
        self.out_count: dict[int, int] = {}  # from the plan: regions per peer per refit
        self.in_count: dict[int, int] = {}
        self.early_sums = self.device.type == "cuda"  # zero-copy sources summed right after posting
        self._got: dict = {}
        self.direct_min = direct_min
        self._holdings_cache: dict[int, dict] = {}
        self._wires: dict[tuple, Wire] = {}
        check_mirror(plan, self.rank)
        self._build_wires()
        checksum(torch.zeros(8, dtype=torch.uint8, device=self.device))  # builds the weight tables now

    # ---- CUDA stream discipline (no-ops on CPU) --------------------------------------------------
    def _side(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def _before_post(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def _after_wait(self) -> None:
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def _settle(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    # ---- messages (computed once from the plan) ---------------------------------------------------
    def _holdings(self, rank: int):
        got = self._holdings_cache.get(rank)
        if got is None:
            T = self.plan.train_world
            got = dict(self.plan.src_holdings(rank) if is_trainer(rank, T) else self.plan.dst_holdings(infer_rank_of(rank, T)))
            self._holdings_cache[rank] = got
        return got

    def _wire(self, kind: str, index: int, sender: int, receiver: int, regions, b: BroadcastBucket | None = None) -> Wire:
        key = (kind, index, sender, receiver)
        w = self._wires.get(key)
        if w is None:
            dst = FullBoxes(self.model, b.tensors) if b is not None else self._holdings(receiver)
            w = wire_of(self.model, regions, self._holdings(sender), dst, self.direct_min)
            self._wires[key] = w
        return w

    def _build_wires(self) -> None:
        """Every message of this rank, from the plan alone (the peer computes the same)."""
        try:
            for s in self.steps:
                if isinstance(s, P2PRound):
                    for pr in s.sends:
                        self._wire("r", s.index, self.rank, pr.peer, pr.regions)
                        self.out_count[pr.peer] = self.out_count.get(pr.peer, 0) + len(pr.regions)
                    for pr in s.recvs:
                        self._wire("r", s.index, pr.peer, self.rank, pr.regions)
                        self.in_count[pr.peer] = self.in_count.get(pr.peer, 0) + len(pr.regions)
                elif isinstance(s, BroadcastBucket):
                    for g in s.gather:
                        if g.peer != s.root and self.rank in (g.peer, s.root):
                            self._wire("g", s.index, g.peer, s.root, g.regions, s)
                            if self.rank == g.peer:
                                self.out_count[s.root] = self.out_count.get(s.root, 0) + len(g.regions)
                            else:
                                self.in_count[g.peer] = self.in_count.get(g.peer, 0) + len(g.regions)
        except TransferError as exc:
            raise TransferError(f"rank {self.rank}: plan messages: {exc.message}") from exc

    def _buffer(self, n: int, pending: _Pending) -> torch.Tensor:
        block = self.pool.acquire(n)
        pending.blocks.append(block)
        view = block[:n]
        assert view.numel() == n
        return view

    def _release(self, p: _Pending) -> None:
        self._settle()
        for b in p.blocks:
            self.pool.release(b)
        p.blocks.clear()

    def _wait(self, p: _Pending) -> None:
        what = f"rank {self.rank}: {p.kind} {p.index} with ranks {p.peers}"
        try:
            wait_works(p.works, self.groups, self.groups.timeout.total_seconds(), what)
        except Abandoned as exc:
            exc.where = {"kind": p.kind, "index": p.index, "peers": p.peers}
            raise
        except (RuntimeError, TransferError) as exc:
            err = TransferError(f"{what} failed: {exc}")
            err.where = {"kind": p.kind, "index": p.index, "peers": p.peers}
            raise err from exc
        self._after_wait()

    # ---- the loop --------------------------------------------------------------------------------
    def run(self, step_no: int, src: LocalWeights | None, staged: LocalWeights | None) -> ExecStats:
        """Execute every step of this rank for refit ``step_no``."""
        self.checks = []
        self.out_sums, self.in_sums, self._got = {}, {}, {}
        self.step_no = step_no
        self.src, self.staged = src, staged
        stats = ExecStats()
        pending: deque[_Pending] = deque()
        depth = 1 if self.overlap else 0
        for s in self.steps:
            if self.is_infer and isinstance(s, P2PRound) and s.sends:
                while pending:  # a relay packs from data received in earlier rounds
                    self._finish(pending.popleft(), stats)
            pending.append(self._start(s, stats))
            while len(pending) > depth:
                self._finish(pending.popleft(), stats)
        while pending:
            self._finish(pending.popleft(), stats)
        stats.steps = len(self.steps)
        return stats

    def _start(self, s: Step, stats: ExecStats) -> _Pending:
        if isinstance(s, P2PRound):
            return self._start_round(s, stats)
        if isinstance(s, BroadcastBucket):
            return self._start_bucket(s, stats)
        raise TransferError(f"unknown step type {type(s).__name__}")

    def _finish(self, p: _Pending, stats: ExecStats) -> None:
        if p.kind == "round":
            self._finish_round(p, stats)
        else:
            self._finish_bucket(p, stats)

    # ---- point-to-point rounds -------------------------------------------------------------------
    def _start_round(self, r: P2PRound, stats: ExecStats) -> _Pending:
        local = self.staged if self.is_infer else self.src
        p = _Pending("round", r.index, peers=sorted({x.peer for x in r.sends + r.recvs}))
        ops, outgoing = [], []
        tag = _tag(r.index, _TAG_ROUND)
        send_bytes = sum(x.nbytes for x in r.sends)
        pack_phase = self.events.phase("round/pack", round=r.index, stage=r.stage, bytes=send_bytes,
                                       peers=[x.peer for x in r.sends], step=self.step_no) if r.sends else nullcontext()
        with pack_phase as ph, self._side():
            if r.sends and local is None:
                raise TransferError(f"rank {self.rank} must send in round {r.index} but holds no weights")
            if r.recvs and self.staged is None:
                raise TransferError(f"rank {self.rank} receives in round {r.index} but has no staged weights")
            for pr in r.sends:
                w = self._wire("r", r.index, self.rank, pr.peer, pr.regions)
                o, sources = self._send_ops(pr.peer, pr.regions, w, local, tag, p)
                ops += o
                outgoing.append((pr.peer, sources))
                stats.bytes_sent += pr.nbytes
            if ph is not None:
                ph["zero_copy_bytes"] = sum(
                    pr.regions[j].nbytes for pr in r.sends
                    for j in self._wire("r", r.index, self.rank, pr.peer, pr.regions).direct
                    if self._wire("r", r.index, self.rank, pr.peer, pr.regions).src[j] is not None)
            for pr in r.recvs:
                w = self._wire("r", r.index, pr.peer, self.rank, pr.regions)
                o, rv = self._recv_ops(pr.peer, pr.regions, w, self.staged, tag, p)
                ops += o
                p.recvs.append(rv)
        self._before_post()
        p.posted_unix, p.posted_at = time.time(), time.perf_counter()
        if ops:
            try:
                p.works = dist.batch_isend_irecv(ops)
            except RuntimeError as exc:
                raise TransferError(f"rank {self.rank}: posting round {r.index} failed: {exc}") from exc
        self._post_sums(outgoing)
        stats.wire_bytes += p.wire
        return p

    def _wait_recorded(self, p: _Pending, phase: str, **fields) -> None:
        """Wait for a posted step; one event spanning post to completion, failed or not."""
        err = None
        try:
            self._wait(p)
        except TransferError as exc:
            err = exc
            raise
        finally:
            self.events.record(phase, p.posted_unix, time.perf_counter() - p.posted_at, error=err,
                               bytes=p.wire, peers=p.peers, step=self.step_no, **fields)

    def _finish_round(self, p: _Pending, stats: ExecStats) -> None:
        self._wait_recorded(p, "round/transfer", round=p.index)
        if p.recvs:
            with self.events.phase("round/unpack", round=p.index, step=self.step_no,
                                   bytes=sum(sum(x.nbytes for x in rv.regions) for rv in p.recvs),
                                   zero_copy_bytes=sum(v.numel() for rv in p.recvs for v, inside in rv.lands if inside),
                                   peers=[rv.peer for rv in p.recvs]), self._side():
                for rv in p.recvs:
                    self._land(rv, self.staged, f"round {p.index}", defer=True)
                    stats.bytes_received += sum(x.nbytes for x in rv.regions)
        self._release(p)

    # ---- gather-and-broadcast buckets --------------------------------------------------------------
    def _bucket_parts(self, b: BroadcastBucket):
        lay = bucket_layout(self.model, b.tensors)
        if lay.payload != b.nbytes:
            raise TransferError(f"bucket {b.index}: tensors hold {lay.payload} B but the plan says {b.nbytes} B")
        pos = {t: k for k, t in enumerate(b.tensors)}
        return lay, pos

    def _start_bucket(self, b: BroadcastBucket, stats: ExecStats) -> _Pending:
        lay, pos = self._bucket_parts(b)
        tag = _tag(b.index, _TAG_GATHER)
        p = _Pending("bucket", b.index, peers=list(b.group))
        mine = [g for g in b.gather if g.peer == self.rank]
        if self.rank == b.root:
            self._gather_at_root(b, lay, pos, tag, p, stats)
        elif mine:  # a trainer sending its pieces to the root (straight from its weights where it can)
            with self.events.phase("bucket/gather", bucket=b.index, step=self.step_no, peers=[b.root],
                                   bytes=sum(g.nbytes for g in mine)), self._side():
                ops, outgoing = [], []
                for g in mine:
                    w = self._wire("g", b.index, self.rank, b.root, g.regions, b)
                    o, sources = self._send_ops(b.root, g.regions, w, self.src, tag, p)
                    ops += o
                    outgoing.append((b.root, sources))
                    stats.bytes_sent += g.nbytes
                self._before_post()
                try:
                    p.works.extend(dist.batch_isend_irecv(ops))
                except RuntimeError as exc:
                    raise TransferError(f"rank {self.rank}: posting gather of bucket {b.index} failed: {exc}") from exc
                self._post_sums(outgoing)
        if self.rank in b.group and self.rank != b.root:
            buf = self._buffer(lay.size, p)
            p.bucket = (b, lay, buf)
            p.wire += lay.size
            p.works.append(self._post_broadcast(b, buf))
        stats.wire_bytes += p.wire
        p.posted_unix, p.posted_at = time.time(), time.perf_counter()
        return p

    def _post_broadcast(self, b: BroadcastBucket, buf: torch.Tensor):
        try:
            return dist.broadcast(buf, src=b.root, group=self.groups.group_for(b.group), async_op=True)
        except RuntimeError as exc:
            raise TransferError(f"rank {self.rank}: posting broadcast of bucket {b.index} failed: {exc}") from exc

    def _gather_at_root(self, b, lay, pos, tag, p: _Pending, stats: ExecStats) -> None:
        """Pieces land straight in the bucket where they are contiguous there (row blocks); only the
        others go through a scratch buffer, released once copied: the root's extra memory is the bucket
        plus those pieces."""
        others = [g for g in b.gather if g.peer != self.rank]
        with self.events.phase("bucket/gather", bucket=b.index, step=self.step_no, bytes=b.nbytes,
                               peers=[g.peer for g in others]):
            bucket = self._buffer(lay.size, p)
            target = BucketTarget(self.model, lay, pos, bucket)
            ops, recvs = [], []
            gp = _Pending("gather", b.index, peers=[g.peer for g in others])
            for g in others:
                w = self._wire("g", b.index, g.peer, self.rank, g.regions, b)
                o, rv = self._recv_ops(g.peer, g.regions, w, target, tag, p)
                ops += o
                recvs.append(rv)
            if ops:
                try:
                    gp.works = dist.batch_isend_irecv(ops)
                except RuntimeError as exc:
                    raise TransferError(f"rank {self.rank}: posting gather of bucket {b.index} failed: {exc}") from exc
            written = [0] * len(b.tensors)
            with self._side():
                for g in b.gather:  # own pieces while the others arrive
                    if g.peer != self.rank:
                        continue
                    for r in g.regions:
                        full = bucket_tensor_view(self.model, r.tensor, lay, pos[r.tensor], bucket)
                        dst = box_bytes_in(full, r.box, self.model.tensors[r.tensor].itemsize)
                        self.src.read_into(r.tensor, r.box, dst)
                        self._copy_check(self.src, r.tensor, r.box, dst,
                                         f"bucket {b.index}: own {self.model.tensors[r.tensor].name} {r.box} copy")
                        written[pos[r.tensor]] += box_numel(r.box)
            self._wait(gp)
            with self._side():
                for rv in recvs:
                    self._land(rv, target, f"bucket {b.index} gather", defer=False)
                    for r in rv.regions:
                        written[pos[r.tensor]] += box_numel(r.box)
                    stats.bytes_received += sum(x.nbytes for x in rv.regions)
                short = [
                    f"{self.model.tensors[t].name}: {w} of {self.model.tensors[t].numel} elements"
                    for t, w in zip(b.tensors, written) if w != self.model.tensors[t].numel
                ]
                if short:
                    raise TransferError(f"bucket {b.index}: the gather does not cover the bucket: " + "; ".join(short[:5]))
                write_trailer(bucket, lay, item_checksums(lay, bucket))
            self._settle()
            for blk in p.blocks[1:]:  # gather messages are done; keep only the bucket
                self.pool.release(blk)
            del p.blocks[1:]
        self._before_post()
        p.wire += lay.size
        stats.bytes_sent += lay.payload
        p.bucket = (b, lay, bucket)
        p.works.append(self._post_broadcast(b, bucket))

    def _finish_bucket(self, p: _Pending, stats: ExecStats) -> None:
        self._wait_recorded(p, "bucket/broadcast", bucket=p.index)
        if p.bucket is not None and self.is_infer:
            b, lay, buf = p.bucket
            with self.events.phase("bucket/unpack", bucket=b.index, step=self.step_no, bytes=b.nbytes), self._side():
                if self.tap is not None and lay.payload:
                    self.tap(self.step_no, buf, lay.offsets[0] + lay.sizes[0])
                held = [k for k, t in enumerate(b.tensors) if self.dst.get(t)]
                if held:
                    got = item_checksums(lay, buf, held)
                    want = trailer_view(lay, buf)[torch.tensor(held, device=buf.device)]
                    self._check((got != want).any(1), [f"bucket {b.index}: {self.model.tensors[b.tensors[k]].name}" for k in held])
                for k in held:
                    t_idx = b.tensors[k]
                    t = self.model.tensors[t_idx]
                    full = bucket_tensor_view(self.model, t_idx, lay, k, buf)
                    for box in self.dst[t_idx]:
                        ref = box_bytes_in(full, box, t.itemsize)
                        self.staged.write_from(t_idx, box, ref)
                        self._copy_check(self.staged, t_idx, box, ref, f"bucket {b.index}: {t.name} {box} copy")
                        stats.bytes_received += box_numel(box) * t.itemsize
        self._release(p)
