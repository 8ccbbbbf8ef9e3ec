"""The verify phase's checksums: what each sender computed, exchanged once per refit, compared.

A mixin of ``Executor`` (it uses the executor's ``out_sums``/``in_sums``/``out_count``/``in_count``,
``device``, ``rank`` and stream helpers): every sender's checksums of one refit travel as ONE int64
message per peer (sizes from the plan), then every receiver compares them with its own, in one host
sync. A rank whose transfer failed still takes part (zeros), so no peer waits for it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.runtime.checksum import checksum

TAG_SUMS = (1 << 30) - 1  # the end-of-refit checksum exchange


class ChecksumExchange:
    def _post_sums(self, outgoing: list) -> None:
        """Keep the checksums (or the zero-copy views to sum later) of what was just posted, per peer."""
        with self._side():
            for peer, sources in outgoing:
                # packed scratch bytes ((view,)) now, while the transfer is in flight; on a GPU all of them
                sources = [checksum(x[0]) if isinstance(x, tuple)
                           else (checksum(x) if self.early_sums and x.dim() else x) for x in sources]
                self.out_sums.setdefault(peer, []).extend(sources)

    def exchange_checksums(self, failed: bool = False) -> None:
        """Verify phase: every sender's checksums of this refit to its receivers, one int64 message per
        peer (sizes from the plan). A rank whose transfer ``failed`` still takes part (zeros), so that no
        peer waits for it beyond a dead connection."""
        ops, self._got = [], {}
        with self._side():
            for peer, n in sorted(self.out_count.items()):
                items = self.out_sums.get(peer, [])
                if failed or len(items) != n:
                    v = torch.zeros(n, dtype=torch.int64, device=self.device)
                else:
                    v = torch.stack([x if x.dim() == 0 else checksum(x) for x in items])
                ops.append(dist.P2POp(dist.isend, v, peer, tag=TAG_SUMS))
                self._got[("out", peer)] = v
            for peer, n in sorted(self.in_count.items()):
                v = torch.empty(n, dtype=torch.int64, device=self.device)
                ops.append(dist.P2POp(dist.irecv, v, peer, tag=TAG_SUMS))
                self._got[peer] = v
        if not ops:
            return
        self._before_post()
        try:
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        except RuntimeError as exc:
            raise TransferError(f"rank {self.rank}: exchanging checksums failed: {exc}") from exc
        self._after_wait()

    def _check(self, mismatch: torch.Tensor, what: list[str]) -> None:
        self.checks.append((mismatch, what))

    def checksum_failures(self, limit: int = 20) -> list[str]:
        """The verify phase: checksums of the regions received straight into the staged weights, then
        every comparison of this refit (one host sync)."""
        with self._side():
            for peer, items in sorted(self.in_sums.items()):
                want = self._got.get(peer)
                if want is None or want.numel() != len(items):
                    self._check(torch.ones(1, dtype=torch.bool), [f"checksums from rank {peer}: "
                                f"{len(items)} regions arrived, {0 if want is None else want.numel()} checksums"])
                    continue
                got = torch.stack([x if not is_view else checksum(x) for x, is_view, _ in items])
                self._check(got != want, [w for _, _, w in items])
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
