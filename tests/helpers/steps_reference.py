"""The straightforward per-entry ``Plan.steps_for`` p2p part (reshardctl ac64780), kept as the reference
the vectorised ``reshardctl.plan.rank_steps.p2p_steps`` must equal (tests/plan/test_rank_steps.py)."""

from __future__ import annotations

import numpy as np

from reshardctl.plan.schedule import P2PRound, PeerRegions, Region


def reference_p2p_steps(plan, rank: int) -> list[P2PRound]:
    steps = []
    for rnd in plan.rounds:
        sends: dict[int, list[Region]] = {}
        recvs: dict[int, list[Region]] = {}
        for e in rnd.records():
            unit = plan.units[e.unit]
            tab = unit.table
            sl = slice(e.t_lo, e.t_hi)
            src, dst = tab.src[sl], tab.dst[sl]
            mine = np.nonzero((src == rank) | (dst == rank))[0]
            if mine.size == 0:
                continue
            for inst in unit.tensors[e.inst_lo : e.inst_hi].tolist():
                for t in mine.tolist():
                    j = e.t_lo + t
                    box = tuple(zip(tab.lo[j].tolist(), tab.hi[j].tolist()))
                    reg = Region(inst, box, int(tab.nbytes[j]))
                    if tab.src[j] == rank:
                        sends.setdefault(int(tab.dst[j]), []).append(reg)
                    else:
                        recvs.setdefault(int(tab.src[j]), []).append(reg)
        if sends or recvs:
            steps.append(P2PRound(rnd.index, rnd.stage,
                                  tuple(PeerRegions(p, tuple(r)) for p, r in sorted(sends.items())),
                                  tuple(PeerRegions(p, tuple(r)) for p, r in sorted(recvs.items()))))
    return steps
