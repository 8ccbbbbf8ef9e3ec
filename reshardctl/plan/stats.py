"""Traffic accounting of a plan: bytes per rank, per link class, per round. Pure numpy.

Link classes, from the topology: ``intra_node`` (NVLink inside a node), ``intra_domain`` (NVLink
between nodes of one multi-node NVLink domain), ``cross_domain`` (the network: NICs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reshardctl.plan.model import Plan
from reshardctl.plan.routing import TransferTable

# rows of a traffic matrix [K, world]
NIC_SEND, NIC_RECV, NVL_SEND, NVL_RECV, MSGS = range(5)
K = 5


def link_class(table: TransferTable, plan_topology) -> np.ndarray:
    """0 intra_node, 1 intra_domain, 2 cross_domain, per transfer."""
    node, dom = plan_topology.node_of, plan_topology.domain_of
    same_node = node[table.src] == node[table.dst]
    same_dom = dom[table.src] == dom[table.dst]
    return np.where(same_node, 0, np.where(same_dom, 1, 2)).astype(np.int8)


def traffic(table: TransferTable, topo, world: int) -> np.ndarray:
    """[K, world] bytes (and message counts) of one instance of a table."""
    cls = link_class(table, topo)
    out = np.zeros((K, world), dtype=np.float64)
    net = cls == 2
    nb = table.nbytes.astype(np.float64)
    out[NIC_SEND] = np.bincount(table.src[net], weights=nb[net], minlength=world)
    out[NIC_RECV] = np.bincount(table.dst[net], weights=nb[net], minlength=world)
    out[NVL_SEND] = np.bincount(table.src[~net], weights=nb[~net], minlength=world)
    out[NVL_RECV] = np.bincount(table.dst[~net], weights=nb[~net], minlength=world)
    # one message per distinct (src, dst) pair, counted on both ends
    if len(table):
        pairs = np.unique(table.src.astype(np.int64) * world + table.dst)
        out[MSGS] = np.bincount(pairs // world, minlength=world) + np.bincount(pairs % world, minlength=world)
    return out


def _by_link(table: TransferTable, topo) -> np.ndarray:
    return np.bincount(link_class(table, topo), weights=table.nbytes.astype(np.float64), minlength=3)


@dataclass(frozen=True)
class PlanStats:
    bytes_total: int  # p2p bytes moved (relayed bytes count on every hop)
    bytes_by_link: dict[str, int]
    num_transfers: int
    num_rounds: int
    rounds: np.ndarray  # [n_rounds, K, world]
    max_staging: int  # largest staging bytes of any rank in any round
    per_rank: np.ndarray  # [K, world] totals

    @property
    def cross_domain_bytes(self) -> int:
        return self.bytes_by_link["cross_domain"]


def p2p_stats(plan: Plan) -> PlanStats:
    world = plan.world
    topo = plan.topology
    unit_traffic: dict[int, np.ndarray] = {}
    rounds = np.zeros((len(plan.rounds), K, world), dtype=np.float64)
    by_link = np.zeros(3, dtype=np.float64)
    max_staging = 0
    for r, rnd in enumerate(plan.rounds):
        staging = np.zeros(world, dtype=np.float64)
        for e in rnd.entries:
            unit = plan.units[e.unit]
            n = e.inst_hi - e.inst_lo
            full = e.t_lo == 0 and e.t_hi == len(unit.table)
            if full:
                got = unit_traffic.get(e.unit)
                if got is None:
                    got = unit_traffic[e.unit] = (traffic(unit.table, topo, world), _by_link(unit.table, topo))
                tr, links = got
            else:
                tab = unit.table.take(np.arange(e.t_lo, e.t_hi))
                tr, links = traffic(tab, topo, world), _by_link(tab, topo)
            rounds[r, :MSGS] += n * tr[:MSGS]
            rounds[r, MSGS] = np.maximum(rounds[r, MSGS], tr[MSGS])  # messages merge per peer
            staging += n * (tr[NIC_SEND] + tr[NIC_RECV] + tr[NVL_SEND] + tr[NVL_RECV])
            by_link += n * links
        max_staging = max(max_staging, int(staging.max()) if world else 0)
    per_rank = rounds.sum(axis=0) if len(plan.rounds) else np.zeros((K, world))
    return PlanStats(
        bytes_total=int(by_link.sum()),
        bytes_by_link={"intra_node": int(by_link[0]), "intra_domain": int(by_link[1]), "cross_domain": int(by_link[2])},
        num_transfers=plan.num_transfers,
        num_rounds=len(plan.rounds),
        rounds=rounds,
        max_staging=max_staging,
        per_rank=per_rank,
    )
