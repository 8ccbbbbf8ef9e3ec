"""Execute one rank's program (program.py): point-to-point rounds and gather-and-broadcast buckets.

Every step is split in two: ``start`` (pack / gather, then post the asynchronous transfer) and
``finish`` (wait, unpack into the *staged* inference weights). With ``overlap`` the runtime starts
step k+1 before finishing step k, so packing (or the next bucket's gather) runs while the previous
transfer is in flight; an inference relay drains everything pending before it packs a stage-2 round
from its staged copy.

Messages (wire.py): at most four per link (peer and step), by where its regions are contiguous.
Where a message's regions lie back to back in this rank's arena (arena.py: boxes in first-use order)
it is sent from / received into the arena itself (zero copy); otherwise it goes through the step's
staging block (span_copy.py, planned once per message and arena layout): one indexed copy where
every region is a set of equal-stride byte runs of the arena (row blocks, column slices, N-D slabs) in
chunks of at least MIN_CHUNK bytes, else one ``as_strided`` copy per run of alike regions; region by
region only where a region spans several local boxes. Each step posts its messages in one
``batch_isend_irecv``.

Checksums (checksum_exchange.py): one per message, taken where the bytes lie: the sender's arena or
staging block, the receiver's arena after landing, or its staging block after the bytes were copied
into place and read back (so the copy is covered too); one ``segment_checksums`` pass per buffer on
CUDA (the arena in the verify phase), on the CPU as the steps go: in-place sends right after their
post, each received message as it lands (round_steps.py). Local copies (a bucket root's own pieces,
bucket -> staged weights) are compared byte for byte. The rounds are ``RoundSteps`` (round_steps.py),
the buckets ``BucketSteps`` (bucket_steps.py); what a step carries is step_state.py's ``Pending``.

On CUDA (docs/gpu.md, "Stream discipline"): packing, unpacking and checksums run on a side stream that
first waits on the current (producer) stream; posts wait on the side stream, unpacking waits on the
transfer (``work.wait()``, then a stream wait), staging blocks are reused after their release event
(buffer_pool.py): the steps are ordered on the device and the host never blocks per step. It blocks once
per refit, on an event after the last unpack (``_drain``), while a ``DeadlineWatch`` thread
(deadline_watch.py) holds every step's deadline and the store's failure check and aborts the
communicators past the one or at the other. The executor never has operations on two NCCL
communicators in flight at once (a broadcast on a bucket's sub-communicator is ordered after the
point-to-point on the world one, on the device).
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import nullcontext

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.runtime.bucket_steps import BucketSteps
from reshardctl.runtime.round_steps import RoundSteps
from reshardctl.runtime.buffer_pool import BufferPool
from reshardctl.runtime.checksum import checksum
from reshardctl.runtime.checksum_exchange import ChecksumExchange
from reshardctl.runtime.cuda_timing import PhaseTimings
from reshardctl.runtime.events import EventLog
from reshardctl.runtime.deadline_watch import DeadlineWatch
from reshardctl.runtime.abort import abort_data_plane
from reshardctl.runtime.bounded_wait import raise_outcome
from reshardctl.runtime.groups import Groups
from reshardctl.runtime import host_staging
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.piece_copy import PieceViews, Pieces, copy_pieces, message_pieces
from reshardctl.runtime.program import BucketOps, Message, RankProgram, RoundOps, compile_program
from reshardctl.runtime.span_copy import MessageCopy, copy_spec
from reshardctl.runtime.step_state import ExecStats, Pending, step_errors
from reshardctl.runtime.wire import align8, place

_UNSET = object()


def arena_place(local, m: Message) -> int | None:
    """The arena offset at which message ``m``'s regions lie back to back in ``local``, else None."""
    if getattr(local, "arena", None) is None:
        return None
    return place(local.model, local.boxes, local.box_offset, m.regions, m.offsets)


def must_drain(step, pending_kinds: list[str], *, is_infer: bool, one_communicator: bool) -> bool:
    """Finish every pending step before starting ``step``? An inference relay packs a stage-2 round
    from what it received in earlier rounds; with NCCL (``one_communicator``) a bucket step, whose
    broadcast runs on a sub-communicator, never overlaps another step (docs/gpu.md)."""
    relay = is_infer and isinstance(step, RoundOps) and bool(step.sends)
    other = one_communicator and (isinstance(step, BucketOps) or "bucket" in pending_kinds)
    return relay or other


def describe(model, m: Message, limit: int = 3) -> str:
    names = [f"{model.tensors[r.tensor].name} {list(r.box)}" for r in m.regions[:limit]]
    more = len(m.regions) - limit
    return f"{m.nbytes} B in {len(m.regions)} regions (" + ", ".join(names) + (f", and {more} more" if more > 0 else "") + ")"


class Executor(RoundSteps, BucketSteps):
    def __init__(self, plan, groups: Groups, events: EventLog, pool: BufferPool, *, tap=None,
                 overlap: bool = True, program: RankProgram | None = None):
        """``tap(step, buf, nbytes)``: called with the first bytes that landed in each step before they
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
        self.program = program if program is not None else compile_program(plan, self.rank)
        self.is_infer = self.program.is_infer
        self.device = groups.device
        self.cuda = self.device.type == "cuda"
        self.host_staged = getattr(groups, "host_staged", False)  # gloo carries CUDA bytes (host_staging.py)
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.timings = PhaseTimings(self.device) if self.cuda else None  # device time of GPU phases
        self._watch: DeadlineWatch | None = None  # CUDA: the refit's transfers, watched by a helper thread
        self.sums = ChecksumExchange(self.rank, groups, self.program.out_messages, self.program.in_messages)
        self._places: dict[tuple[int, int], int | None] = {}
        self._copies: dict[tuple[int, int], tuple | None] = {}  # staged messages copied by chunk index
        self._layouts: list = []  # keeps the box_offset dicts keyed by id in ``_places`` alive
        self.pieces = PieceViews()  # piece copies outside an arena (piece_copy.py), views built once
        self._held: dict[int, tuple] = {}  # bucket ops id -> its held items (``_held_items``)
        pool.notify_on_free(self.pieces.drop)
        checksum(torch.zeros(8, dtype=torch.uint8, device=self.device))  # builds the weight tables now

    # ---- CUDA stream discipline (no-ops on CPU) --------------------------------------------------
    def _phase(self, name: str, **fields):
        """A phase event: host time on CPU; on CUDA the side stream's device time (cuda_timing.py),
        written when the verify phase has synchronised anyway."""
        if self.timings is not None:
            return self.timings.phase(name, stream=self.stream, **fields)
        return self.events.phase(name, **fields)

    def _side(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def _before_post(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def _after_wait(self) -> None:
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def _settle(self) -> None:
        """The host waits for what the side stream enqueued so far: one event, recorded now (blocking:
        the host sleeps, no spin), not the whole device."""
        if self.stream is not None:
            done = torch.cuda.Event(blocking=True)
            done.record(self.stream)
            done.synchronize()

    def _released(self):
        """CUDA: an event after the side stream's last use of a step's blocks (its unpack and checksums,
        which the side stream enqueued after the step's transfer); the pool makes the next user's stream
        wait on it, so a block is reused stream-ordered, without the host."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    # ---- messages ----------------------------------------------------------------------------------
    def _place(self, m: Message, local) -> int | None:
        layout = getattr(local, "box_offset", None)
        if layout is None or getattr(local, "arena", None) is None:
            return None
        key = (id(m), id(layout))
        got = self._places.get(key, _UNSET)
        if got is _UNSET:
            got = self._places[key] = arena_place(local, m)
            if not self._layouts or self._layouts[-1] is not layout:
                self._layouts.append(layout)
        return got

    def _copy_plan(self, m: Message, local):
        """How a staged message is copied (span_copy.py: one indexed copy, or a few strided ones), once
        per message and arena layout; None: region by region."""
        layout = getattr(local, "box_offset", None)
        if layout is None or getattr(local, "arena", None) is None:
            return None
        key = (id(m), id(layout))
        got = self._copies.get(key, _UNSET)
        if got is _UNSET:
            spec = copy_spec(local, m.regions, m.offsets)
            got = self._copies[key] = MessageCopy(spec, self.device) if spec is not None else None
            if not self._layouts or self._layouts[-1] is not layout:
                self._layouts.append(layout)
        return got

    def _message_pieces(self, kind: str, m: Message, weights, block: torch.Tensor, o: int,
                        v: torch.Tensor) -> Pieces:
        """The pieces of a staged message where the arena copy does not apply (the API's own tensors, a
        bucket root's gather, a region spanning several boxes), views built once per message, weights
        and block: ``send``, staging <- weights; ``land``, weights <- staging."""
        items = ((r.tensor, r.box, ro, r.nbytes) for r, ro in zip(m.regions, m.offsets))
        return self.pieces.get((kind, id(m)), weights.data, block, o,
                               lambda: message_pieces(weights, items, v, send=kind == "send"))

    def _block(self, sizes: list[int], p: Pending) -> tuple[torch.Tensor | None, list[int]]:
        """One staging block for a step's copied messages; their (8-byte aligned) offsets in it."""
        offs, n = [], 0
        for s in sizes:
            offs.append(n)
            n = align8(n + s)
        if not sizes:
            return None, []
        block = self.pool.acquire(n)
        p.blocks.append(block)
        return block, offs

    def _post_sends(self, links, local, tag: int, p: Pending, stats: ExecStats) -> list:
        """Ops sending every message of ``links`` (zero copy from the arena where it can), checksums booked."""
        msgs = [(x.peer, m) for x in links for m in x.messages]
        places = [self._place(m, local) for _, m in msgs]
        block, offs = self._block([m.nbytes for (_, m), at in zip(msgs, places) if at is None], p)
        ops, k = [], 0
        for (peer, m), at in zip(msgs, places):
            if at is not None:
                v = local.arena[at : at + m.nbytes]
                self.sums.sent(peer, buf=local.arena, off=at, n=m.nbytes)
                stats.zero_copy_messages += 1
                p.sent_in_place += m.nbytes
            else:
                o = offs[k]
                k += 1
                v = block[o : o + m.nbytes]
                cp = self._copy_plan(m, local)
                if cp is not None:
                    cp.gather(local, v)
                else:
                    copy_pieces(self._message_pieces("send", m, local, block, o, v))
                self.sums.sent(peer, buf=block, off=o, n=m.nbytes)
            ops.append(dist.P2POp(dist.isend, v, peer, tag=tag, group=self.groups.data))
            p.wire += m.nbytes
            stats.bytes_sent += m.nbytes
        if block is not None:
            self.sums.settle(block)  # before posting: measured faster on gloo than after (docs/benchmarks.md)
        return ops

    def _post_recvs(self, links, target, tag: int, p: Pending, stats: ExecStats, places=None) -> list:
        msgs = [(x.peer, m) for x in links for m in x.messages]
        if places is None:
            places = [self._place(m, target) for _, m in msgs]
        else:
            places = [at for per_link in places for at in per_link]
        block, offs = self._block([m.nbytes for (_, m), at in zip(msgs, places) if at is None], p)
        ops, k = [], 0
        for (peer, m), at in zip(msgs, places):
            if at is not None:
                v, blk, off = target.arena[at : at + m.nbytes], None, at
                stats.zero_copy_messages += 1
            else:
                off = offs[k]
                v, blk = block[off : off + m.nbytes], block
                k += 1
            p.recvs.append((peer, m, v, blk, off))
            ops.append(dist.P2POp(dist.irecv, v, peer, tag=tag, group=self.groups.data))
            p.wire += m.nbytes
        return ops

    def _land(self, p: Pending, target, label: str, stats: ExecStats) -> None:
        """Copy what arrived through staging into place, read it back (the copy is covered too), and
        book every message's checksum where its bytes finally lie; then sum each staging block once."""
        for n, rec in enumerate(p.recvs):
            self._book_landed(n, rec, target, label, stats)
        for blk in p.blocks:
            self.sums.settle(blk)

    def _land_one(self, n: int, rec: tuple, target, label: str, stats: ExecStats) -> None:
        """One message of a step that is in (``_finish_round_per_message``): landed, and its checksum
        taken now, where its bytes finally lie."""
        self._book_landed(n, rec, target, label, stats)
        blk = rec[3]
        self.sums.settle(blk if blk is not None else target.arena)

    def _book_landed(self, n: int, rec: tuple, target, label: str, stats: ExecStats) -> None:
        peer, m, v, blk, off = rec
        if n == 0 and self.tap is not None and m.nbytes:
            self.tap(self.step_no, v, m.nbytes)
        if blk is not None:
            cp = self._copy_plan(m, target)
            if cp is not None:
                cp.scatter(target, v)
                cp.gather(target, v)  # read back what landed
            else:
                pieces = self._message_pieces("land", m, target, blk, off, v)
                copy_pieces(pieces)
                torch._foreach_copy_(pieces.src, pieces.dst)  # read back what landed
        self.sums.received(peer, lambda peer=peer, m=m: f"{label} from rank {peer}: {describe(self.model, m)}",
                           buf=blk if blk is not None else target.arena, off=off, n=m.nbytes)
        stats.bytes_received += m.nbytes

    def _release(self, p: Pending) -> None:
        ev = self._released()
        for b in p.blocks:
            self.pool.release(b, ev)
        p.blocks.clear()

    def _post(self, ops: list, what: str) -> list:
        if not ops:
            return []
        try:
            if self.host_staged:
                return host_staging.post_p2p(ops, self.groups, f"rank {self.rank}: {what}")
            return dist.batch_isend_irecv(ops)
        except RuntimeError as exc:
            raise TransferError(f"rank {self.rank}: posting {what} failed: {exc}") from exc

    def _wait(self, p: Pending) -> None:
        what = f"rank {self.rank}: {p.kind} {p.index} with ranks {p.peers}"
        if self._watch is not None:
            self._order_after(p, what)
            return
        self._wait_part(p, p.works, time.monotonic() + self.groups.timeout.total_seconds(), what)
        self._after_wait()

    def _order_after(self, p: Pending, what: str) -> None:
        """CUDA: the step's consumers ordered after its transfer on the device (``work.wait()``: the
        current stream waits for NCCL's; then the side stream for the current), the host not blocked;
        the refit's ``DeadlineWatch`` holds the step's deadline (``_drain``)."""
        with step_errors(p, what):  # host-staged gloo: another rank's failure; a communicator failed or aborted
            for w in p.works:
                w.wait()
        self._watch.watch(p.works, p)
        self._after_wait()

    def _drain(self) -> None:
        """CUDA, end of a refit's steps: the host's one wait for the transfers (an event after the side
        stream's last unpack), released early by the watch's abort past a step's deadline or at another
        rank's failure, which is then raised naming that step."""
        error: BaseException | None = None
        try:
            self._settle()
        except RuntimeError as exc:
            error = exc
        self._watch.stop()
        self._raise_watched()
        if error is not None:
            raise TransferError(f"rank {self.rank}: refit {self.step_no}: {error}") from error

    def _raise_watched(self) -> None:
        """The refit's watch aborted: its reason raised, naming the step (``Abandoned`` or a timeout)."""
        o = self._watch.outcome
        if o is not None:
            p = o.label
            what = f"rank {self.rank}: {p.kind} {p.index} with ranks {p.peers}" if p is not None else \
                f"rank {self.rank}: refit {self.step_no}"
            try:
                raise_outcome(o, what, self.groups.timeout.total_seconds())
            except TransferError as exc:
                if p is not None:
                    exc.where = {"kind": p.kind, "index": p.index, "peers": p.peers}
                raise

    def _mark_posted(self, p: Pending, phase: str, **fields) -> None:
        p.posted_unix, p.posted_at = time.time(), time.perf_counter()
        if self.timings is not None:
            p.span = self.timings.begin(phase, stream=torch.cuda.current_stream(self.device), bytes=p.wire,
                                        peers=p.peers, step=self.step_no, **fields)

    def _wait_recorded(self, p: Pending, phase: str, **fields) -> None:
        """Wait for a posted step; one event spanning post to completion, failed or not."""
        err = None
        try:
            self._wait(p)
        except TransferError as exc:
            err = exc
            raise
        finally:
            if p.span is not None and err is None:  # CUDA: device time from post to the transfer's end
                self.timings.end(p.span)
            else:
                self.events.record(phase, p.posted_unix, time.perf_counter() - p.posted_at, error=err,
                                   bytes=p.wire, peers=p.peers, step=self.step_no, **fields)

    # ---- the loop --------------------------------------------------------------------------------
    def run(self, step_no: int, src: LocalWeights | None, staged: LocalWeights | None) -> ExecStats:
        """Execute every step of this rank's program for refit ``step_no``."""
        self.sums.begin()
        self.step_no = step_no
        self.src, self.staged = src, staged
        stats = ExecStats()
        pending: deque[Pending] = deque()
        depth = 1 if self.overlap else 0
        if self.stream is None:
            self._steps(stats, pending, depth)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the producer's writes first
            self._watch = DeadlineWatch(self.groups.timeout.total_seconds(),
                                        abort=lambda g=self.groups: abort_data_plane(g),
                                        failure=self.groups.failure).start()
            try:
                try:
                    self._steps(stats, pending, depth)
                except (RuntimeError, TransferError):  # a post on a communicator the watch aborted
                    self._watch.stop()
                    self._raise_watched()
                    raise
                self._drain()
            finally:
                self._watch.stop()
                self._watch = None
        stats.steps = len(self.program.steps)
        return stats

    def _steps(self, stats: ExecStats, pending: deque, depth: int) -> None:
        for s in self.program.steps:
            if must_drain(s, [x.kind for x in pending], is_infer=self.is_infer, one_communicator=self.cuda):
                while pending:
                    self._finish(pending.popleft(), stats)
            pending.append(self._start(s, stats))
            while len(pending) > depth:
                self._finish(pending.popleft(), stats)
        while pending:
            self._finish(pending.popleft(), stats)

    def exchange_checksums(self) -> None:
        with self._side():
            self.sums.exchange()

    def checksum_failures(self, limit: int = 20) -> list[str]:
        self._settle()
        if self.timings is not None:
            self.timings.flush(self.events, wait=True)
        return self.sums.failures(limit)

    def _start(self, s, stats: ExecStats) -> Pending:
        if isinstance(s, RoundOps):
            return self._start_round(s, stats)
        return self._start_bucket(s, stats)

    def _finish(self, p: Pending, stats: ExecStats) -> None:
        if p.kind == "round" and p.recvs and not self.cuda:
            self._finish_round_per_message(p, stats)
        elif p.kind == "round":
            self._wait_recorded(p, "round/transfer", round=p.index)
            if p.recvs:
                with self._phase("round/unpack", round=p.index, step=self.step_no,
                                       bytes=sum(m.nbytes for _, m, *_ in p.recvs),
                                       zero_copy_bytes=sum(m.nbytes for _, m, _, blk, _ in p.recvs if blk is None),
                                       peers=sorted({peer for peer, *_ in p.recvs})), self._side():
                    self._land(p, self.staged, f"round {p.index}", stats)
            self._release(p)
        else:
            self._finish_bucket(p, stats)
