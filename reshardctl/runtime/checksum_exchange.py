"""The verify phase's checksums: what each sender computed, exchanged once per refit, compared.

A mixin of ``Executor`` (it uses the executor's ``out_sums``/``in_sums``/``out_count``/``in_count``,
``device``, ``rank`` and stream helpers): every sender's checksums of one refit travel as ONE int64
message per peer (``WORDS`` per region, sizes from the plan), then every receiver compares them with
its own (taken where the bytes finally landed), in one host sync. A rank whose transfer failed publishes the failure instead (groups.py), so no peer waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.runtime.checksum import WORDS, checksum, segment_checksums
from reshardctl.runtime.groups import Abandoned, wait_works

TAG_SUMS = (1 << 30) - 1  # the end-of-refit checksum exchange


@dataclass(frozen=True)
class Later:
    """A region's bytes at ``buf[off:off+n]`` (a packed or scratch copy), summed with the rest of its buffer."""

    buf: torch.Tensor
    off: int
    n: int


class ChecksumExchange:
    def _post_sums(self, outgoing: list) -> None:
        """Keep the checksums of what was just posted, per peer, in plan order: copies in packed or
        scratch buffers (``_Later``) are summed now, one pass per buffer, while the transfer is in flight;
        zero-copy views of the weights are summed in the verify phase (on a GPU: now, on the side stream)."""
        with self._side():
            by_buf: dict[int, list] = {}
            for _, sources in outgoing:
                for k, x in enumerate(sources):
                    if isinstance(x, Later):
                        by_buf.setdefault(id(x.buf), []).append((sources, k, x))
            for items in by_buf.values():
                sums = segment_checksums(items[0][2].buf, [x.off for _, _, x in items], [x.n for _, _, x in items])
                for i, (sources, k, _) in enumerate(items):
                    sources[k] = sums[i]
            for peer, sources in outgoing:
                sources = [checksum(x) if self.early_sums and x.dtype == torch.uint8 else x for x in sources]
                self.out_sums.setdefault(peer, []).extend(sources)

    def exchange_checksums(self) -> None:
        """Verify phase: every sender's checksums of this refit to its receivers, one int64 message per
        peer (``WORDS`` per region, sizes from the plan), on the gloo control group (CPU tensors),
        every wait bounded (a dead, silent or failed peer ends it within the timeout)."""
        ops, self._got = [], {}
        ctrl = self.groups.ctrl
        with self._side():
            for peer, n in sorted(self.out_count.items()):
                items = self.out_sums.get(peer, [])
                if len(items) != n:
                    raise TransferError(f"rank {self.rank}: {len(items)} checksums for rank {peer}, the plan says {n}")
                v = torch.stack([x if x.dtype == torch.int64 else checksum(x) for x in items]).cpu()
                ops.append(dist.P2POp(dist.isend, v, peer, tag=TAG_SUMS, group=ctrl))
                self._got[("out", peer)] = v
            for peer, n in sorted(self.in_count.items()):
                v = torch.empty(n, WORDS, dtype=torch.int64)
                ops.append(dist.P2POp(dist.irecv, v, peer, tag=TAG_SUMS, group=ctrl))
                self._got[peer] = v
        if not ops:
            return
        try:
            wait_works(dist.batch_isend_irecv(ops), self.groups, self.groups.timeout.total_seconds(),
                       f"rank {self.rank}: checksum exchange")
        except Abandoned:
            raise
        except (RuntimeError, TransferError) as exc:
            raise TransferError(f"rank {self.rank}: exchanging checksums failed: {exc}") from exc

    def _check(self, mismatch: torch.Tensor, what: list[str]) -> None:
        self.checks.append((mismatch, what))

    def checksum_failures(self, limit: int = 20) -> list[str]:
        """The verify phase: checksums of the regions received straight into the staged weights, then
        every comparison of this refit (one host sync)."""
        with self._side():
            for peer, items in sorted(self.in_sums.items()):
                want = self._got.get(peer)
                if want is None or want.shape[0] != len(items):
                    self._check(torch.ones(1, dtype=torch.bool), [f"checksums from rank {peer}: "
                                f"{len(items)} regions arrived, {0 if want is None else want.shape[0]} checksums"])
                    continue
                got = torch.stack([x if x.dtype == torch.int64 else checksum(x) for x, _ in items])
                self._check((got.cpu() != want).any(1), [w for _, w in items])
            self.in_sums = {}
        self._settle()
        out = []
        for mismatch, what in self.checks:
            for bad, w in zip(mismatch.cpu().tolist(), what):
                if bad:
                    out.append(f"checksum mismatch: {w}")
                    if len(out) >= limit:
                        return out
        return out
