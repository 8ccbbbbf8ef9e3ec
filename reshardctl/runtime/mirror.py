"""Before anything is posted: every message a rank will post is mirrored by its peer's plan.

gloo aborts the process (not an exception) when a receive buffer's size differs from the message, so
the executor checks, when it is built, that for every round and bucket the peer expects exactly the
regions (hence bytes) this rank will send, and sends exactly what it expects.
"""

from __future__ import annotations

from reshardctl.errors import TransferError
from reshardctl.plan.schedule import BroadcastBucket, P2PRound, PeerRegions, Step


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
