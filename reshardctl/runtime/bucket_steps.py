"""The gather-and-broadcast steps of a rank's program (its buckets), part of the ``Executor``
(runtime/executor.py, whose stream discipline, message posting and landing they use): a trainer sends
its pieces to the bucket's root (straight from its arena where it can), the root gathers them straight
into the bucket where they lie back to back there, sums the bucket (its trailer) and broadcasts it;
every member checks the tensors it holds against the trailer and copies its slices into its staged
weights, compared byte for byte."""

from __future__ import annotations

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.runtime import host_staging
from reshardctl.runtime.bucket_format import BucketTarget, item_checksums, trailer_view, write_trailer
from reshardctl.runtime.piece_copy import bucket_pieces, copy_checked
from reshardctl.runtime.program import BucketOps
from reshardctl.runtime.step_state import TAG_GATHER, ExecStats, Pending, step_tag


class BucketSteps:
    """The bucket half of ``Executor`` (a mixin: the executor's state and helpers are its own)."""

    def _start_bucket(self, bo: BucketOps, stats: ExecStats) -> Pending:
        b = bo.bucket
        tag = step_tag(b.index, TAG_GATHER)
        p = Pending("bucket", b.index, list(b.group))
        if self.rank == b.root:
            self._gather_at_root(bo, tag, p, stats)
        else:
            if bo.sends:  # a trainer sending its pieces to the root (straight from its arena where it can)
                gp = Pending("gather", b.index, [b.root])
                with self._phase("bucket/gather", bucket=b.index, step=self.step_no, peers=[b.root],
                                       bytes=sum(x.nbytes for x in bo.sends)):
                    with self._side():
                        ops = self._post_sends(bo.sends, self.src, tag, gp, stats)
                    self._before_post()  # posted on the current stream, which waits for the packs (as rounds)
                    works = self._post(ops, f"gather of bucket {b.index}")
                self._sum_sent_in_place(self.src, gp, bucket=b.index)
                if self.cuda and bo.member:  # NCCL: the world's gather done before the sub-communicator's broadcast
                    gp.works = works
                    self._wait(gp)
                    self._release(gp)
                else:
                    p.works.extend(works)
                    p.blocks.extend(gp.blocks)
                stats.wire_bytes += gp.wire
            if bo.member:
                buf = self.pool.acquire(bo.layout.size)
                p.blocks.append(buf)
                view = buf[: bo.layout.size]
                p.bucket = (bo, view, buf)
                p.wire += bo.layout.size
                self._mark_posted(p, "bucket/broadcast", bucket=b.index)
                p.works.append(self._post_broadcast(bo, view))
        stats.wire_bytes += p.wire
        if not p.posted_at:
            self._mark_posted(p, "bucket/broadcast", bucket=b.index)
        return p

    def _post_broadcast(self, bo: BucketOps, buf: torch.Tensor):
        b = bo.bucket
        try:
            if self.host_staged:  # gloo carrying CUDA bytes: through a host buffer (host_staging.py)
                return host_staging.broadcast(buf, b.root, self.groups.group_for(b.group), self.groups, self.rank,
                                              f"rank {self.rank}: broadcast of bucket {b.index}")
            return dist.broadcast(buf, src=b.root, group=self.groups.group_for(b.group), async_op=True)
        except RuntimeError as exc:
            raise TransferError(f"rank {self.rank}: posting broadcast of bucket {b.index} failed: {exc}") from exc

    def _gather_at_root(self, bo: BucketOps, tag: int, p: Pending, stats: ExecStats) -> None:
        """Pieces land straight in the bucket where they lie back to back there; only the others go
        through a staging block, released once copied: the root's extra memory is the bucket plus those."""
        b, lay = bo.bucket, bo.layout
        with self._phase("bucket/gather", bucket=b.index, step=self.step_no, bytes=b.nbytes,
                               peers=[x.peer for x in bo.recvs]):
            block = self.pool.acquire(lay.size)
            p.blocks.append(block)
            bucket = block[: lay.size]
            target = BucketTarget(self.model, lay, bo.pos, bucket, block)
            gp = Pending("gather", b.index, [x.peer for x in bo.recvs])
            ops = self._post_recvs(bo.recvs, target, tag, gp, stats, places=bo.recv_at)
            gp.works = self._post(ops, f"gather of bucket {b.index}")
            with self._side():  # own pieces while the others arrive
                own = self.pieces.get(("own", id(bo)), self.src.data, block, 0, lambda: bucket_pieces(
                    self.model, lay, ((bo.pos[r.tensor], r.tensor, r.box) for r in bo.own), self.src, bucket,
                    into_bucket=True))
                copy_checked(own, self.sums.check, f"bucket {b.index}: own")
            self._wait(gp)
            with self._side():
                self._land(gp, target, f"bucket {b.index} gather", stats)
                self.sums.settle(bucket)
                write_trailer(bucket, lay, item_checksums(lay, bucket))
            self._release(gp)
        self._before_post()
        p.wire += lay.size
        stats.bytes_sent += lay.payload
        self._mark_posted(p, "bucket/broadcast", bucket=b.index)
        p.works.append(self._post_broadcast(bo, bucket))

    def _held_items(self, bo: BucketOps, device) -> tuple:
        """A member's held items of a bucket: their positions (a list and an index tensor on ``device``)
        and one failure description each; built once per bucket."""
        got = self._held.get(id(bo))
        if got is None:
            ks = [k for k, _, _ in bo.held]
            whats = [lambda t=t: f"bucket {bo.bucket.index}: {self.model.tensors[t].name}" for _, t, _ in bo.held]
            got = self._held[id(bo)] = (ks, torch.tensor(ks, device=device), whats)
        return got

    def _finish_bucket(self, p: Pending, stats: ExecStats) -> None:
        self._wait_recorded(p, "bucket/broadcast", bucket=p.index)
        if p.bucket is not None and self.is_infer:
            bo, buf, block = p.bucket
            b, lay = bo.bucket, bo.layout
            with self._phase("bucket/unpack", bucket=b.index, step=self.step_no, bytes=b.nbytes), self._side():
                if self.tap is not None and lay.payload:
                    self.tap(self.step_no, buf, lay.offsets[0] + lay.sizes[0])
                if bo.held:
                    ks, at, whats = self._held_items(bo, buf.device)
                    got = item_checksums(lay, buf, ks)
                    want = trailer_view(lay, buf)[at]
                    self.sums.check((got != want).any(1), whats)
                held = self.pieces.get(("unpack", id(bo)), self.staged.data, block, 0, lambda: bucket_pieces(
                    self.model, lay, ((k, t, box) for k, t, boxes in bo.held for box in boxes), self.staged, buf,
                    into_bucket=False))
                copy_checked(held, self.sums.check, f"bucket {b.index}", consume_source=True)  # released next
                stats.bytes_received += held.nbytes
        self._release(p)
