"""The point-to-point rounds of a rank's program, part of the ``Executor`` (runtime/executor.py, whose
stream discipline, message posting and landing they use): a round packs (or sends in place) and posts
every message of its links in one grouped operation; on the CPU a sender sums what it sent in place
right after the post, and a receiver lands and sums each message as soon as it is in, while the
round's later messages still arrive (docs/checksums.md, "Coverage")."""

from __future__ import annotations

import time

from reshardctl.errors import TransferError
from reshardctl.runtime.bounded_wait import wait_works
from reshardctl.runtime.program import RoundOps
from reshardctl.runtime.step_state import TAG_ROUND, ExecStats, Pending, step_errors, step_tag


class RoundSteps:
    """The round half of ``Executor`` (a mixin: the executor's state and helpers are its own)."""

    def _start_round(self, r: RoundOps, stats: ExecStats) -> Pending:
        local = self.staged if self.is_infer else self.src
        p = Pending("round", r.index, list(r.peers))
        tag = step_tag(r.index, TAG_ROUND)
        if r.sends and local is None:
            raise TransferError(f"rank {self.rank} must send in round {r.index} but holds no weights")
        if r.recvs and self.staged is None:
            raise TransferError(f"rank {self.rank} receives in round {r.index} but has no staged weights")
        ops = []
        if r.sends:
            with self._phase("round/pack", round=r.index, stage=r.stage, step=self.step_no,
                                   bytes=sum(x.nbytes for x in r.sends), peers=[x.peer for x in r.sends]) as ph, \
                    self._side():
                zc0 = stats.zero_copy_messages
                ops += self._post_sends(r.sends, local, tag, p, stats)
                ph["zero_copy_bytes"] = p.sent_in_place  # counted while posting: no second walk
                ph["zero_copy_messages"] = stats.zero_copy_messages - zc0
        ops += self._post_recvs(r.recvs, self.staged, tag, p, stats)
        self._before_post()
        self._mark_posted(p, "round/transfer", round=r.index)
        p.works = self._post(ops, f"round {r.index}")
        stats.wire_bytes += p.wire
        self._sum_sent_in_place(local, p, round=r.index)
        return p

    def _sum_sent_in_place(self, local, p: Pending, **fields) -> None:
        """CPU: the checksums of what this step sent straight from the arena, taken now, while gloo's
        threads send it (they only read those bytes), not in the verify phase. On CUDA they stay booked
        for the verify phase (the side stream's order: docs/gpu.md)."""
        if self.cuda or not p.sent_in_place or getattr(local, "arena", None) is None:
            return
        with self._phase("checksum/sent", step=self.step_no, bytes=p.sent_in_place, **fields):
            self.sums.settle(local.arena)

    def _finish_round_per_message(self, p: Pending, stats: ExecStats) -> None:
        """CPU (gloo: one work per message): each received message landed and checksummed as soon as it
        is in, while the round's later messages still arrive; the round's transfer event spans the post
        to the last message (the landing of the earlier ones inside it), its unpack event the landing
        of the last. Every wait bounded by what is left of the one timeout of the round."""
        what = f"rank {self.rank}: round {p.index} with ranks {p.peers}"
        first_recv = len(p.works) - len(p.recvs)
        end = time.monotonic() + self.groups.timeout.total_seconds()
        err = None
        try:
            for k, rec in enumerate(p.recvs):
                self._wait_part(p, [p.works[first_recv + k]], end, what)
                if k + 1 < len(p.recvs):
                    self._land_one(k, rec, self.staged, f"round {p.index}", stats)
            self._wait_part(p, p.works[:first_recv], end, what)
        except TransferError as exc:
            err = exc
            raise
        finally:
            self.events.record("round/transfer", p.posted_unix, time.perf_counter() - p.posted_at, error=err,
                               bytes=p.wire, peers=p.peers, step=self.step_no, round=p.index)
        last = p.recvs[-1]
        with self._phase("round/unpack", round=p.index, step=self.step_no, bytes=last[1].nbytes,
                         zero_copy_bytes=last[1].nbytes if last[3] is None else 0, peers=[last[0]]):
            self._land_one(len(p.recvs) - 1, last, self.staged, f"round {p.index}", stats)
        self._release(p)

    def _wait_part(self, p: Pending, works: list, end: float, what: str) -> None:
        """Some of a step's works, bounded by the step's deadline ``end`` (monotonic), errors as ``_wait``'s."""
        with step_errors(p, what):
            wait_works(works, self.groups, max(0.0, end - time.monotonic()), what)
