"""Posting one peer's messages and landing what arrived: a mixin of ``Executor``.

It uses the executor's ``groups``, ``model``, ``tap`` and ``step_no``, ``_buffer`` and ``_check``. The
split of regions into a packed message and zero-copy messages comes from ``pack.Wire``; this module
decides where each region's checksum is taken (docs/checksums.md, "Coverage"): on the sender, in its
weights where the region is contiguous there, else in its packed copy; on the receiver, where the bytes
finally lie.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from reshardctl.runtime.checksum import checksum, segment_checksums
from reshardctl.runtime.checksum_exchange import Later
from reshardctl.runtime.pack import LocalWeights, Wire


@dataclass
class _Recv:
    """One peer's incoming messages of one step: where every region lands, and the sender's checksums."""

    peer: int
    regions: tuple
    wire: Wire
    packed: torch.Tensor | None  # the packed message buffer
    lands: list  # per direct region: (view, in_target)


class MessageIO:
    def _send_ops(self, peer: int, regions, w: Wire, local: LocalWeights, tag: int, p):
        """Ops sending ``regions`` to ``peer`` (packed message first, then the direct regions), and what
        each region's checksum is taken from: its bytes in the weights where they are contiguous there
        (a uint8 view, summed later), else its packed/scratch copy (``Later``, summed right after
        posting, one pass per message)."""
        ops, sources = [], [None] * len(regions)
        if w.packed:
            buf = self._buffer(w.packed_size, p)
            for j, off in zip(w.packed, w.layout.offsets):
                r = regions[j]
                local.read_into(r.tensor, r.box, buf[off : off + r.nbytes])
                sources[j] = (local.span_view(r.tensor, w.src[j], r.nbytes) if w.src[j] is not None
                              else Later(buf, off, r.nbytes))
            ops.append(dist.P2POp(dist.isend, buf, peer, tag=tag, group=self.groups.data))
            p.wire += w.packed_size
        for j in w.direct:
            r = regions[j]
            if w.src[j] is not None:
                v = local.span_view(r.tensor, w.src[j], r.nbytes)  # zero copy
                sources[j] = v
            else:
                v = self._buffer(r.nbytes, p)
                local.read_into(r.tensor, r.box, v)
                sources[j] = Later(v, 0, r.nbytes)
            assert v.numel() == r.nbytes
            ops.append(dist.P2POp(dist.isend, v, peer, tag=tag, group=self.groups.data))
            p.wire += r.nbytes
        return ops, sources

    def _recv_ops(self, peer: int, regions, w: Wire, target, tag: int, p):
        ops = []
        packed = None
        if w.packed:
            packed = self._buffer(w.packed_size, p)
            ops.append(dist.P2POp(dist.irecv, packed, peer, tag=tag, group=self.groups.data))
            p.wire += w.packed_size
        lands = []
        for j in w.direct:
            r = regions[j]
            if w.dst[j] is not None:
                v, inside = target.span_view(r.tensor, w.dst[j], r.nbytes), True  # zero copy
            else:
                v, inside = self._buffer(r.nbytes, p), False
            assert v.numel() == r.nbytes
            lands.append((v, inside))
            ops.append(dist.P2POp(dist.irecv, v, peer, tag=tag, group=self.groups.data))
            p.wire += r.nbytes
        return ops, _Recv(peer, regions, w, packed, lands)

    def _land(self, rv: _Recv, target, what: str, *, defer: bool) -> None:
        """Place what arrived from one peer into ``target`` (the staged weights, or a bucket at its root),
        then take every region's checksum from where it finally lies: a contiguous span of ``target`` is
        summed there (in the verify phase when ``defer``); any other region is read back from ``target``
        into its receive buffer and summed there (one pass per message). So the copy into ``target`` is
        covered as well as the wire."""
        regions, w = rv.regions, rv.wire
        names = [f"{what} from rank {rv.peer}: {self.model.tensors[x.tensor].name} {x.box}" for x in regions]
        got: list = [None] * len(regions)
        if self.tap is not None:  # a drill's corruption (worker layer): the first region that landed
            hit = next(((v, v.numel()) for v, _ in rv.lands), None)
            if hit is None and w.packed:
                hit = (rv.packed, w.layout.offsets[0] + regions[w.packed[0]].nbytes)
            if hit is not None:
                self.tap(self.step_no, hit[0], hit[1])
        back_off, back_n, back_j = [], [], []
        if w.packed:
            for j, off in zip(w.packed, w.layout.offsets):
                r = regions[j]
                seg = rv.packed[off : off + r.nbytes]
                target.write_from(r.tensor, r.box, seg)
                if w.dst[j] is not None:
                    v = target.span_view(r.tensor, w.dst[j], r.nbytes)
                    got[j] = (v if defer else checksum(v), names[j])
                else:
                    target.read_into(r.tensor, r.box, seg)  # read back what landed
                    back_off.append(off)
                    back_n.append(r.nbytes)
                    back_j.append(j)
        if back_j:
            sums = segment_checksums(rv.packed, back_off, back_n)
            for k, j in enumerate(back_j):
                got[j] = (sums[k], names[j])
        for j, (v, inside) in zip(w.direct, rv.lands):
            r = regions[j]
            if inside:
                target.mark_written(r.tensor, w.dst[j][0], r.box)
                got[j] = (v if defer else checksum(v), names[j])
            else:
                target.write_from(r.tensor, r.box, v)
                target.read_into(r.tensor, r.box, v)  # read back what landed
                got[j] = (checksum(v), names[j])
        self.in_sums.setdefault(rv.peer, []).extend(got)

    def _copy_check(self, local: LocalWeights, index: int, box, ref: torch.Tensor, what: str) -> None:
        """A local copy checked byte for byte: ``box`` of ``local`` equals ``ref``, the bytes it was
        copied from or to (compared in place, in the verify phase's one host sync)."""
        self._check(local.differs(index, box, ref), [what])
