"""Execute one rank's steps of a plan: packed point-to-point rounds and gather-and-broadcast buckets.

Every step is split in two: ``start`` (pack / gather, then post the asynchronous transfer) and
``finish`` (wait, verify checksums, unpack into the *staged* inference weights). With ``overlap``
the runtime starts step k+1 before finishing step k, so packing (or the next bucket's gather) runs
while the previous transfer is in flight; an inference relay drains everything pending before it
packs a stage-2 round from its staged copy. Message sizes come from the plan on both sides and are
cross-checked against the peers' steps once, before anything is posted (a gloo size mismatch aborts
the process instead of raising).
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
from reshardctl.plan.schedule import BroadcastBucket, P2PRound, PeerRegions, Step
from reshardctl.runtime.checksum import checksum
from reshardctl.runtime.events import EventLog
from reshardctl.runtime.faults import Faults
from reshardctl.runtime.groups import Groups
from reshardctl.runtime.pack import (
    BufferPool,
    LocalWeights,
    box_bytes_in,
    bucket_layout,
    bucket_tensor_view,
    message_layout,
    pack_message,
    unpack_message,
    verify_message,
    write_trailer,
)

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


def check_mirror(plan, rank: int) -> None:
    """Every message this rank posts has the same regions (hence size) on the peer's side."""
    cache: dict[int, dict[int, Step]] = {}

    def peer_step(peer: int, index: int) -> Step | None:
        if peer not in cache:
            cache[peer] = {s.index: s for s in plan.steps_for(peer)}
        return cache[peer].get(index)

    def regions_of(prs: tuple[PeerRegions, ...], peer: int):
        return next((p.regions for p in prs if p.peer == peer), None)

    problems = []
    for s in plan.steps_for(rank):
        if isinstance(s, P2PRound):
            for mine, theirs_attr, verb in ((s.sends, "recvs", "sends"), (s.recvs, "sends", "receives")):
                for pr in mine:
                    if pr.peer == rank:
                        problems.append(f"round {s.index}: rank {rank} {verb} to itself")
                        continue
                    other = peer_step(pr.peer, s.index)
                    theirs = regions_of(getattr(other, theirs_attr), rank) if isinstance(other, P2PRound) else None
                    if theirs != pr.regions:
                        problems.append(
                            f"round {s.index}: rank {rank} {verb} {pr.nbytes} B with rank {pr.peer}, which expects "
                            + ("nothing" if theirs is None else f"{sum(r.nbytes for r in theirs)} B in other regions")
                        )
        elif isinstance(s, BroadcastBucket):
            for g in s.gather:
                if rank in (g.peer, s.root) and g.peer != s.root:
                    other = peer_step(s.root if rank == g.peer else g.peer, s.index)
                    if other != s:
                        problems.append(f"bucket {s.index}: rank {rank} and its gather peer disagree on the bucket")
    if problems:
        raise TransferError(
            f"plan is inconsistent for rank {rank} ({len(problems)} problems): " + "; ".join(problems[:5]),
            hint="messages of mismatched sizes would abort the process; the planner must produce mirrored steps",
        )


class Executor:
    def __init__(self, plan, groups: Groups, events: EventLog, pool: BufferPool, faults: Faults, *,
                 overlap: bool = True):
        self.plan = plan
        self.model = plan.model
        self.env = groups.env
        self.rank = self.env.global_rank
        self.groups = groups
        self.events = events
        self.pool = pool
        self.faults = faults
        self.overlap = overlap
        self.steps = plan.steps_for(self.rank)
        self.is_infer = self.env.side == "infer"
        self.dst = plan.dst_holdings(self.env.side_rank) if self.is_infer else {}
        self.device = groups.device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.checks: list[tuple[torch.Tensor, list[str]]] = []
        check_mirror(plan, self.rank)
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
        try:
            for w in p.works:
                w.wait()
        except RuntimeError as exc:
            raise TransferError(
                f"rank {self.rank}: {p.kind} {p.index} with ranks {p.peers} failed: {exc}"
            ) from exc
        self._after_wait()

    # ---- the loop --------------------------------------------------------------------------------
    def run(self, step_no: int, src: LocalWeights | None, staged: LocalWeights | None) -> ExecStats:
        """Execute every step of this rank for refit ``step_no``."""
        self.checks = []
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
        ops = []
        send_bytes = sum(x.nbytes for x in r.sends)
        pack_phase = self.events.phase("round/pack", round=r.index, stage=r.stage, bytes=send_bytes,
                                       peers=[x.peer for x in r.sends], step=self.step_no) if r.sends else nullcontext()
        with pack_phase, self._side():
            if r.sends and local is None:
                raise TransferError(f"rank {self.rank} must send in round {r.index} but holds no weights")
            for pr in r.sends:
                lay = message_layout(self.model, pr.regions)
                buf = self._buffer(lay.size, p)
                pack_message(pr.regions, lay, local, buf)
                ops.append(dist.P2POp(dist.isend, buf, pr.peer, tag=_tag(r.index, _TAG_ROUND)))
                p.wire += lay.size
                stats.bytes_sent += lay.payload
            for pr in r.recvs:
                lay = message_layout(self.model, pr.regions)
                buf = self._buffer(lay.size, p)
                ops.append(dist.P2POp(dist.irecv, buf, pr.peer, tag=_tag(r.index, _TAG_ROUND)))
                p.recvs.append((pr, lay, buf))
                p.wire += lay.size
        stats.wire_bytes += p.wire
        self._before_post()
        p.posted_unix, p.posted_at = time.time(), time.perf_counter()
        if ops:
            try:
                p.works = dist.batch_isend_irecv(ops)
            except RuntimeError as exc:
                raise TransferError(f"rank {self.rank}: posting round {r.index} failed: {exc}") from exc
        return p

    def _finish_round(self, p: _Pending, stats: ExecStats) -> None:
        err = None
        try:
            self._wait(p)
        except TransferError as exc:
            err = exc
            raise
        finally:
            self.events.record("round/transfer", p.posted_unix, time.perf_counter() - p.posted_at, error=err,
                               round=p.index, bytes=p.wire, peers=p.peers, step=self.step_no)
        if p.recvs:
            with self.events.phase("round/unpack", round=p.index, step=self.step_no,
                                   bytes=sum(pr.nbytes for pr, _, _ in p.recvs),
                                   peers=[pr.peer for pr, _, _ in p.recvs]), self._side():
                if self.staged is None:
                    raise TransferError(f"rank {self.rank} receives in round {p.index} but has no staged weights")
                for pr, lay, buf in p.recvs:
                    self.faults.maybe_corrupt(self.step_no, buf, lay.payload and lay.offsets[0] + pr.regions[0].nbytes)
                    self._check(verify_message(lay, buf), [
                        f"round {p.index} from rank {pr.peer}: {self.model.tensors[x.tensor].name} {x.box}"
                        for x in pr.regions
                    ])
                    unpack_message(pr.regions, lay, buf, self.staged)
                    stats.bytes_received += lay.payload
        self._release(p)

    def _check(self, mismatch: torch.Tensor, what: list[str]) -> None:
        self.checks.append((mismatch, what))

    def checksum_failures(self, limit: int = 20) -> list[str]:
        out = []
        for mismatch, what in self.checks:
            for bad, w in zip(mismatch.cpu().tolist(), what):
                if bad:
                    out.append(f"checksum mismatch: {w}")
                    if len(out) >= limit:
                        return out
        return out

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
        elif mine:  # a trainer sending its pieces to the root
            with self.events.phase("bucket/gather", bucket=b.index, step=self.step_no, peers=[b.root],
                                   bytes=sum(g.nbytes for g in mine)), self._side():
                works = []
                for g in mine:
                    mlay = message_layout(self.model, g.regions)
                    buf = self._buffer(mlay.size, p)
                    pack_message(g.regions, mlay, self.src, buf)
                    self._before_post()
                    works.append(dist.isend(buf, b.root, tag=tag))
                    p.wire += mlay.size
                    stats.bytes_sent += mlay.payload
                p.works.extend(works)
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
        others = [g for g in b.gather if g.peer != self.rank]
        with self.events.phase("bucket/gather", bucket=b.index, step=self.step_no, bytes=b.nbytes,
                               peers=[g.peer for g in others]):
            bucket = self._buffer(lay.size, p)
            ops, recvs = [], []
            gp = _Pending("gather", b.index, peers=[g.peer for g in others])
            for g in others:
                mlay = message_layout(self.model, g.regions)
                buf = self._buffer(mlay.size, p)
                ops.append(dist.P2POp(dist.irecv, buf, g.peer, tag=tag))
                recvs.append((g, mlay, buf))
                p.wire += mlay.size
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
                        self.src.read_into(r.tensor, r.box, box_bytes_in(full, r.box, self.model.tensors[r.tensor].itemsize))
                        written[pos[r.tensor]] += box_numel(r.box)
            self._wait(gp)
            with self._side():
                for g, mlay, buf in recvs:
                    self.faults.maybe_corrupt(self.step_no, buf, mlay.payload and mlay.offsets[0] + g.regions[0].nbytes)
                    self._check(verify_message(mlay, buf), [
                        f"bucket {b.index} gather from rank {g.peer}: {self.model.tensors[x.tensor].name} {x.box}"
                        for x in g.regions
                    ])
                    for r, off in zip(g.regions, mlay.offsets):
                        t = self.model.tensors[r.tensor]
                        full = bucket_tensor_view(self.model, r.tensor, lay, pos[r.tensor], bucket)
                        shaped = buf[off : off + r.nbytes].view(box_bytes_in(full, r.box, t.itemsize).shape)
                        box_bytes_in(full, r.box, t.itemsize).copy_(shaped)
                        written[pos[r.tensor]] += box_numel(r.box)
                    stats.bytes_received += mlay.payload
                short = [
                    f"{self.model.tensors[t].name}: {w} of {self.model.tensors[t].numel} elements"
                    for t, w in zip(b.tensors, written) if w != self.model.tensors[t].numel
                ]
                if short:
                    raise TransferError(f"bucket {b.index}: the gather does not cover the bucket: " + "; ".join(short[:5]))
                write_trailer(bucket, lay, [checksum(bucket[o : o + n]) for o, n in zip(lay.offsets, lay.sizes)])
            for blk in p.blocks[1:]:  # gather messages are done; keep only the bucket
                self.pool.release(blk)
            del p.blocks[1:]
        self._before_post()
        p.wire += lay.size
        stats.bytes_sent += lay.payload
        p.bucket = (b, lay, bucket)
        p.works.append(self._post_broadcast(b, bucket))

    def _finish_bucket(self, p: _Pending, stats: ExecStats) -> None:
        err = None
        try:
            self._wait(p)
        except TransferError as exc:
            err = exc
            raise
        finally:
            self.events.record("bucket/broadcast", p.posted_unix, time.perf_counter() - p.posted_at, error=err,
                               bucket=p.index, bytes=p.wire, peers=p.peers, step=self.step_no)
        if p.bucket is not None and self.is_infer:
            b, lay, buf = p.bucket
            with self.events.phase("bucket/unpack", bucket=b.index, step=self.step_no, bytes=b.nbytes), self._side():
                self.faults.maybe_corrupt(self.step_no, buf, lay.payload and lay.offsets[0] + lay.sizes[0])
                held = [k for k, t in enumerate(b.tensors) if self.dst.get(t)]
                if held:
                    got = torch.stack([checksum(buf[lay.offsets[k] : lay.offsets[k] + lay.sizes[k]]) for k in held])
                    want = buf[lay.trailer : lay.size].view(torch.int64)[torch.tensor(held, device=buf.device)]
                    self._check(got != want, [f"bucket {b.index}: {self.model.tensors[b.tensors[k]].name}" for k in held])
                for k in held:
                    t_idx = b.tensors[k]
                    t = self.model.tensors[t_idx]
                    full = bucket_tensor_view(self.model, t_idx, lay, k, buf)
                    for box in self.dst[t_idx]:
                        self.staged.write_from(t_idx, box, box_bytes_in(full, box, t.itemsize))
                        stats.bytes_received += box_numel(box) * t.itemsize
        self._release(p)
