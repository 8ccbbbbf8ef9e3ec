"""Cost model: predicted refit seconds per transport, and the physical lower bound.

Every figure comes from the site profile's links (no fitted constants). Stated in docs/cost-model.md.

Resources (per direction, send and receive counted separately):
* NVLink of a GPU: ``nvlink_bytes_per_s`` (traffic inside a node or a multi-node NVLink domain);
* the NIC of a GPU: ``nic_bytes_per_s`` (a GPU uses one rail);
* the NICs of a node together: ``nics_per_node * nic_bytes_per_s`` (shared by its GPUs).

P2P rounds are synchronous: a round lasts as long as its most loaded resource
(bytes / bandwidth) plus its per-message latency (messages of one rank taken one after another);
the refit is the sum of its rounds. A broadcast bucket is a pipelined ring: bytes / the slowest
hop bandwidth plus a latency per hop; gathering bucket k+1 overlaps broadcasting bucket k.

Lower bound (transport-independent): the largest of
* every inference GPU's bytes over its ingress (NVLink + NIC of that GPU);
* every inference NVLink domain's distinct bytes over the NICs of its inference nodes (when no
  trainer rank shares the domain);
* the model's bytes over the trainer nodes' NICs (when no inference rank shares a trainer domain);
* on ``cpu_only`` sites (every rank a process on one machine): all bytes the inference ranks hold over
  the host's copy bandwidth (the profile's node NIC figure), which every step is also charged with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reshardctl.plan.model import Plan
from reshardctl.plan.stats import MSGS, NIC_RECV, NIC_SEND, NVL_RECV, NVL_SEND, PlanStats, p2p_stats


@dataclass(frozen=True)
class Links:
    """Bandwidths in bytes/s per direction, latencies in seconds (from ``site.LinkSpec``)."""

    nvlink: float
    nic: float
    node_nic: float
    nvlink_latency: float
    nic_latency: float
    host: float | None = None  # cpu_only sites: every byte is a copy through one shared memory system

    @classmethod
    def from_site(cls, site) -> "Links":
        lk = site.links
        return cls(lk.nvlink_bytes_per_s, lk.nic_bytes_per_s, lk.node_nic_bytes_per_s, lk.nvlink_latency_us * 1e-6,
                   lk.nic_latency_us * 1e-6, host=lk.node_nic_bytes_per_s if site.cpu_only else None)


@dataclass(frozen=True)
class Prediction:
    transport: str
    predicted_s: float
    bytes_moved: int  # bytes on the wire (relayed and broadcast bytes counted per hop/receiver)
    busiest_rank: int
    busiest_link: str  # "nic_send" | "nic_recv" | "nvlink_send" | "nvlink_recv" | "node_nic_send" | ...
    busiest_link_bytes: int
    num_steps: int  # rounds + buckets


def _round_time(tr: np.ndarray, node_of: np.ndarray, num_nodes: int, links: Links) -> tuple[float, int, str, float]:
    """Seconds of one step with traffic ``tr`` [K, world]; returns (time, rank, link, bytes)."""
    cands = [
        ("nic_send", tr[NIC_SEND], links.nic),
        ("nic_recv", tr[NIC_RECV], links.nic),
        ("nvlink_send", tr[NVL_SEND], links.nvlink),
        ("nvlink_recv", tr[NVL_RECV], links.nvlink),
    ]
    best = (0.0, 0, "none", 0.0)
    for name, vec, bw in cands:
        r = int(np.argmax(vec))
        t = vec[r] / bw
        if t > best[0]:
            best = (t, r, name, float(vec[r]))
    for name, row in (("node_nic_send", NIC_SEND), ("node_nic_recv", NIC_RECV)):
        per_node = np.bincount(node_of, weights=tr[row], minlength=num_nodes)
        n = int(np.argmax(per_node))
        t = per_node[n] / links.node_nic
        if t > best[0]:
            best = (t, int(np.nonzero(node_of == n)[0][0]), name, float(per_node[n]))
    if links.host:
        total = float(tr[NIC_SEND].sum() + tr[NVL_SEND].sum())
        t = total / links.host
        if t > best[0]:
            best = (t, int(np.argmax(tr[NIC_SEND] + tr[NVL_SEND])), "host_copy", total)
    latency = tr[MSGS].max() * max(links.nic_latency, links.nvlink_latency) if tr[MSGS].any() else 0.0
    return float(best[0] + latency), best[1], best[2], best[3]


def _bucket_traffic(plan: Plan, bucket) -> tuple[np.ndarray, np.ndarray]:
    """[K, world] traffic of a bucket's gather, and of its broadcast (one ring over root + receivers)."""
    world = plan.world
    dom = plan.topology.domain_of
    g = np.zeros((5, world))
    for pr in bucket.gather:
        if pr.peer == bucket.root:
            continue
        nb = pr.nbytes
        net = dom[pr.peer] != dom[bucket.root]
        g[NIC_SEND if net else NVL_SEND, pr.peer] += nb
        g[NIC_RECV if net else NVL_RECV, bucket.root] += nb
        g[MSGS, pr.peer] += 1
        g[MSGS, bucket.root] += 1
    b = np.zeros((5, world))
    ring = list(bucket.group)
    for a, c in zip(ring, ring[1:]):  # ring order: root, then receivers in rank order
        net = dom[a] != dom[c]
        b[NIC_SEND if net else NVL_SEND, a] += bucket.nbytes
        b[NIC_RECV if net else NVL_RECV, c] += bucket.nbytes
        b[MSGS, a] = 1
        b[MSGS, c] = 1
    return g, b


def predict(plan: Plan, links: Links, stats: PlanStats | None = None) -> Prediction:
    topo = plan.topology
    num_nodes = int(topo.node_of.max()) + 1
    total = 0.0
    busiest = (0.0, 0, "none", 0.0)
    moved = 0
    if plan.rounds:
        stats = stats or p2p_stats(plan)
        moved += stats.bytes_total
        for r in range(stats.num_rounds):
            t, rank, link, nb = _round_time(stats.rounds[r], topo.node_of, num_nodes, links)
            total += t
            if nb > busiest[3]:
                busiest = (t, rank, link, nb)
    prev_bcast = 0.0
    for i, b in enumerate(plan.buckets):
        g, bc = _bucket_traffic(plan, b)
        tg = _round_time(g, topo.node_of, num_nodes, links)
        tb = _round_time(bc, topo.node_of, num_nodes, links)
        hops = len(b.group) - 1
        tb_t = tb[0] + hops * links.nic_latency
        total += tg[0] if i == 0 else max(tg[0], prev_bcast)  # gather k+1 overlaps broadcast k
        prev_bcast = tb_t
        moved += int(g[NIC_SEND].sum() + g[NVL_SEND].sum()) + b.nbytes * hops
        for t, rank, link, nb in (tg, tb):
            if nb > busiest[3]:
                busiest = (t, rank, link, nb)
    total += prev_bcast
    return Prediction(plan.transport, float(total), moved, busiest[1], busiest[2], int(busiest[3]), len(plan.rounds) + len(plan.buckets))


def _classes_overlap(tpl) -> bool:
    """Do two replica classes of a template (slots with different holdings) share an element?"""
    classes = tpl.replica_classes()
    boxes = [(c, b) for c, cls in enumerate(classes) for b in tpl.holdings[cls[0]]]
    if len(classes) < 2 or len(boxes) < 2:
        return False
    owner = np.asarray([c for c, _ in boxes])
    arr = np.asarray([b for _, b in boxes], dtype=np.int64)  # [n, ndim, 2]
    lo = np.maximum(arr[:, None, :, 0], arr[None, :, :, 0])
    hi = np.minimum(arr[:, None, :, 1], arr[None, :, :, 1])
    return bool((np.all(lo < hi, axis=2) & (owner[:, None] != owner[None, :])).any())


def _union_numel(boxes) -> int:
    """Elements covered by (possibly overlapping) boxes: a coordinate-compressed coverage grid."""
    ndim = len(boxes[0])
    cuts = [np.unique([x for b in boxes for x in b[d]]) for d in range(ndim)]
    grid = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    for b in boxes:
        grid[tuple(slice(int(np.searchsorted(cuts[d], b[d][0])), int(np.searchsorted(cuts[d], b[d][1]))) for d in range(ndim))] = True
    cell = np.ones(grid.shape, dtype=np.int64)
    for d in range(ndim):
        cell = cell * np.diff(cuts[d]).reshape([-1 if j == d else 1 for j in range(ndim)])
    return int(cell[grid].sum())


@dataclass(frozen=True)
class LowerBound:
    seconds: float
    reason: str  # which resource binds


def lower_bound(plan: Plan, links: Links) -> LowerBound:
    """Transport-independent: bytes that must cross the most loaded GPU ingress / domain NICs."""
    topo = plan.topology
    T, I = topo.train_world, topo.infer_world
    model = plan.model
    need = np.zeros(I)  # bytes each inference rank must end up with
    infer_dom = topo.domain_of[T:]
    domains = np.unique(infer_dom)
    dom_index = {int(d): k for k, d in enumerate(domains)}
    dom_bytes = np.zeros(len(domains))  # distinct bytes needed per inference domain
    cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    counts: dict[tuple[int, int], int] = {}
    keep = []  # placements stay referenced, so their ids are stable
    for i, t in enumerate(model.tensors):
        p = plan.infer.placement(i)
        key = (id(p), t.itemsize)
        if key in counts:
            counts[key] += 1
            continue
        counts[key] = 1
        keep.append(p)
        got = cache.get(key)
        if got is None:
            tpl = p.template
            per_rank = np.zeros(I)
            per_dom = np.zeros(len(domains))
            dom_classes: dict[int, list[int]] = {}
            for c, cls in enumerate(tpl.replica_classes()):
                n = tpl.slot_numel(cls[0])
                ranks = np.asarray([p.ranks[s] for s in cls])
                np.add.at(per_rank, ranks, n)
                for d in np.unique(infer_dom[ranks]):
                    per_dom[dom_index[int(d)]] += n
                    dom_classes.setdefault(dom_index[int(d)], []).append(c)
            if _classes_overlap(tpl):  # count each element once per domain, not once per class
                classes = tpl.replica_classes()
                for k, cs in dom_classes.items():
                    per_dom[k] = _union_numel([b for c in cs for b in tpl.holdings[classes[c][0]]])
            cache[key] = (per_rank, per_dom)
    for key, n in counts.items():
        per_rank, per_dom = cache[key]
        need += per_rank * key[1] * n
        dom_bytes += per_dom * key[1] * n
    cands: list[tuple[float, str]] = []
    shares_domain = np.intersect1d(topo.domain_of[:T], infer_dom).size > 0
    has_nvlink_peer = topo.gpus_per_node > 1 or topo.nodes_per_domain > 1
    ingress = links.nic + (links.nvlink if has_nvlink_peer else 0.0)
    g = int(np.argmax(need)) if I else 0
    cands.append((need[g] / ingress, f"inference rank {g} must receive {int(need[g])} bytes over NVLink+NIC"))
    if not shares_domain:
        for k, d in enumerate(domains):
            nodes = np.unique(topo.node_of[T:][infer_dom == d]).size
            cands.append((dom_bytes[k] / (nodes * links.node_nic), f"NVLink domain {int(d)} must take in {int(dom_bytes[k])} distinct bytes over the NICs of {nodes} node(s)"))
        cands.append((model.num_bytes / (topo.train_nodes * links.node_nic), f"{model.num_bytes} model bytes must leave {topo.train_nodes} trainer node(s) over their NICs"))
    if links.host:
        cands.append((need.sum() / links.host, f"{int(need.sum())} bytes must be copied into the inference processes through one host's memory"))
    secs, reason = max(cands)
    return LowerBound(float(secs), reason)
