"""The verify phase's checksums: one per message, taken where the bytes lie, exchanged once per refit.

The executor owns one ``ChecksumExchange``. Per refit it books, per peer and in plan order, the
checksum of every message this rank sent (``out``) and received (``in``). A checksum is either taken
at once or *later*: segments of one buffer (the arena, a step's staging block, a bucket) are summed
together in one ``segment_checksums`` call (a few kernels, whatever the number of messages) when the
buffer is settled: a staging block before it is released, the arenas in the verify phase. Then every
sender's checksums travel as ONE int64 message per peer (``WORDS`` per message, counts from the
program) on the gloo control group, and each receiver compares them with its own in one host sync.
A rank whose transfer failed publishes the failure instead (groups.py), so no peer waits for it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.runtime.checksum import WORDS, checksum, segment_checksums
from reshardctl.runtime.bounded_wait import Abandoned, wait_works
from reshardctl.runtime.groups import Groups

TAG_SUMS = (1 << 30) - 1  # the end-of-refit checksum exchange


class ChecksumExchange:
    def __init__(self, rank: int, groups: Groups, out_messages: dict[int, int], in_messages: dict[int, int]):
        self.rank, self.groups = rank, groups
        self.out_messages, self.in_messages = out_messages, in_messages
        self.begin()

    def begin(self) -> None:
        """A new refit: nothing booked."""
        self.out: dict[int, list] = {}
        self.inn: dict[int, list] = {}
        self.whats: dict[int, list[Callable[[], str]]] = {}
        self.local: list[tuple[torch.Tensor, list[Callable[[], str]]]] = []  # local copy checks
        self._later: dict[int, tuple[torch.Tensor, list]] = {}  # id(buf) -> (buf, [(slot list, pos, off, n)])
        self._got: dict[int, torch.Tensor] = {}

    def _book(self, book: dict, peer: int, value) -> tuple[list, int]:
        slots = book.setdefault(peer, [])
        slots.append(value)
        return slots, len(slots) - 1

    def sent(self, peer: int, sum_now: torch.Tensor | None = None, *, buf=None, off: int = 0, n: int = 0) -> None:
        """The checksum of a message sent to ``peer``: ``sum_now``, or later from ``buf[off:off+n]``."""
        slots, pos = self._book(self.out, peer, sum_now)
        if sum_now is None:
            self._defer(buf, slots, pos, off, n)

    def received(self, peer: int, what: Callable[[], str], *, buf, off: int, n: int) -> None:
        """A message from ``peer`` that now lies (finally) at ``buf[off:off+n]``; ``what`` names it."""
        slots, pos = self._book(self.inn, peer, None)
        self.whats.setdefault(peer, []).append(what)
        self._defer(buf, slots, pos, off, n)

    def _defer(self, buf: torch.Tensor, slots: list, pos: int, off: int, n: int) -> None:
        if off % 2:  # checksums read 16-bit limbs from even offsets: an odd start is summed alone, now
            slots[pos] = checksum(buf[off : off + n])
            return
        entry = self._later.get(id(buf))
        if entry is None:
            entry = self._later[id(buf)] = (buf, [])
        entry[1].append((slots, pos, off, n))

    def settle(self, buf: torch.Tensor) -> None:
        """Sum every booked segment of ``buf`` now (one pass); call before ``buf`` is reused."""
        entry = self._later.pop(id(buf), None)
        if entry is None:
            return
        buf, items = entry
        sums = segment_checksums(buf, [o for _, _, o, _ in items], [n for _, _, _, n in items])
        for k, (slots, pos, _, _) in enumerate(items):
            slots[pos] = sums[k]

    def settle_all(self) -> None:
        for key in list(self._later):
            self.settle(self._later[key][0])

    def check(self, mismatch: torch.Tensor, what: list[Callable[[], str]]) -> None:
        """A local comparison (bool per item, True = differs), resolved in the verify phase."""
        self.local.append((mismatch, what))

    def exchange(self) -> None:
        """Every sender's checksums of this refit to its receivers, one int64 message per peer, on the
        gloo control group (CPU tensors); every wait bounded (a dead, silent or failed peer ends it
        within the timeout)."""
        self.settle_all()
        ops = []
        ctrl = self.groups.ctrl
        peers = sorted(self.out_messages.items())
        for peer, n in peers:
            if len(self.out.get(peer, [])) != n:
                raise TransferError(f"rank {self.rank}: {len(self.out.get(peer, []))} checksums for rank {peer}, "
                                    f"the program says {n}")
        # every peer's checksums to the host in one copy (one sync on a GPU), then one message per peer
        mine = [x for peer, _ in peers for x in self.out.get(peer, ())]
        flat = torch.stack(mine).cpu() if mine else torch.empty(0, WORDS, dtype=torch.int64)
        keep = flat.split([n for _, n in peers])
        for (peer, _), v in zip(peers, keep):
            ops.append(dist.P2POp(dist.isend, v, peer, tag=TAG_SUMS, group=ctrl))
        for peer, n in sorted(self.in_messages.items()):
            v = torch.empty(n, WORDS, dtype=torch.int64)
            ops.append(dist.P2POp(dist.irecv, v, peer, tag=TAG_SUMS, group=ctrl))
            self._got[peer] = v
        if not ops:
            return
        try:
            wait_works(dist.batch_isend_irecv(ops), self.groups, self.groups.timeout.total_seconds(),
                       f"rank {self.rank}: checksum exchange", device=False)  # gloo works
        except Abandoned:
            raise
        except (RuntimeError, TransferError) as exc:
            raise TransferError(f"rank {self.rank}: exchanging checksums failed: {exc}") from exc

    def failures(self, limit: int = 20) -> list[str]:
        """Every comparison of this refit (one host sync): local copies, then each peer's messages."""
        checks = list(self.local)  # (flags, descriptions): local copies, then per peer in order
        received = {}  # position in ``checks`` -> the checksums the peer sent
        for peer, items in sorted(self.inn.items()):
            want = self._got.get(peer)
            if want is None or want.shape[0] != len(items) or any(x is None for x in items):
                n = 0 if want is None else want.shape[0]
                checks.append((torch.ones(1, dtype=torch.bool),
                               [lambda p=peer, k=len(items), n=n: f"checksums from rank {p}: {k} messages arrived, {n} checksums"]))
            elif items:
                received[len(checks)] = want
                checks.append((torch.stack(items), self.whats.get(peer, [])))
        # what this rank computed (the local flags, its own checksums of what it received) to the host
        # in one copy: one sync on a GPU, not one per check or per peer
        host = _to_host([x.reshape(-1).to(torch.int64) for x, _ in checks])
        results = []
        for k, (h, (_, what)) in enumerate(zip(host, checks)):
            want = received.get(k)
            results.append((h != 0, what) if want is None else ((h.view(want.shape) != want).any(1), what))
        out = []
        for mismatch, what in results:
            if not bool(mismatch.any()):  # the usual case: no Python per item
                continue
            for bad, w in zip(mismatch.tolist(), what):
                if bad:
                    out.append(f"checksum mismatch: {w()}")
                    if len(out) >= limit:
                        return out
        return out


def _to_host(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``parts`` (1-D int64) on the CPU, in order: those on a device copied together, in one transfer."""
    on_dev = [i for i, x in enumerate(parts) if x.device.type != "cpu"]
    out = list(parts)
    if on_dev:
        host = torch.cat([parts[i] for i in on_dev]).cpu().split([parts[i].numel() for i in on_dev])
        for i, h in zip(on_dev, host):
            out[i] = h
    return out
