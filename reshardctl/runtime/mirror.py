"""Every message of a plan is mirrored: what one rank sends in a step, its peer expects in that step.

gloo aborts the process (not an exception) when a receive buffer's size differs from the message, and
NCCL hangs, so a plan whose steps are not mirrored must be refused before anything is posted. The
planner's plans are mirrored by construction (one table entry yields both the send and the receive;
tests/plan/test_planner_properties.py checks it on random plans with this function); a plan written out
rank by rank (``StaticPlan``: hand-made, or from another tool) is checked once, whole, when it is
built or unpickled: O(the plan), not per rank and per peer.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from reshardctl.errors import TransferError
from reshardctl.plan.schedule import BroadcastBucket, P2PRound, Step


def mirror_problems(steps: Mapping[int, Sequence[Step]]) -> list[str]:
    sent: dict[tuple[int, int, int], tuple] = {}
    expected: dict[tuple[int, int, int], tuple] = {}
    buckets: dict[int, BroadcastBucket] = {}
    present: set[tuple[int, int]] = set()  # (rank, bucket index)
    problems: list[str] = []
    for rank, ss in sorted(steps.items()):
        for s in ss:
            if isinstance(s, P2PRound):
                for pr in s.sends:
                    if pr.peer == rank:
                        problems.append(f"round {s.index}: rank {rank} sends to itself")
                    sent[(s.index, rank, pr.peer)] = pr.regions
                for pr in s.recvs:
                    if pr.peer == rank:
                        problems.append(f"round {s.index}: rank {rank} receives from itself")
                    expected[(s.index, pr.peer, rank)] = pr.regions
            elif isinstance(s, BroadcastBucket):
                first = buckets.setdefault(s.index, s)
                if first is not s and first != s:
                    problems.append(f"bucket {s.index}: rank {rank} and another rank disagree on the bucket")
                present.add((rank, s.index))
    for idx, b in buckets.items():
        for who in sorted(set(b.group) | {g.peer for g in b.gather}):
            if (who, idx) not in present:
                problems.append(f"bucket {idx}: rank {who} takes part but does not have the step")
    for key, regions in sent.items():
        theirs = expected.get(key)
        if theirs != regions:
            idx, a, b = key
            nb = sum(r.nbytes for r in regions)
            problems.append(f"round {idx}: rank {a} sends {nb} B to rank {b}, which expects "
                            + ("nothing" if theirs is None else f"{sum(r.nbytes for r in theirs)} B in other regions"))
    for key, regions in expected.items():
        if key not in sent:
            idx, a, b = key
            problems.append(f"round {idx}: rank {b} expects {sum(r.nbytes for r in regions)} B from rank {a}, "
                            f"which sends nothing")
    return problems


def check_mirror(steps: Mapping[int, Sequence[Step]]) -> None:
    problems = mirror_problems(steps)
    if problems:
        raise TransferError(
            f"plan is inconsistent ({len(problems)} problems): " + "; ".join(problems[:5]),
            hint="messages of mismatched sizes would abort the process; the planner must produce mirrored steps",
        )
