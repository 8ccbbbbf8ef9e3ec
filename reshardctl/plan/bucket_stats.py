"""Traffic accounting of gather-and-broadcast buckets, as arrays over buckets (pure numpy, one pass).

Per bucket: the gather into the root (bytes per link and direction at the root and at the busiest
sender, messages, bytes copied through packed buffers), the broadcast ring over the bucket's group
(its members in group order: which hops cross nodes and how many members each node has, for the
rails a ring can use), and what the inference ranks do with it (checksum every tensor they hold a
part of, copy out their own slices).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reshardctl.plan.refit_plan import Plan


@dataclass(frozen=True)
class Ring:
    """The broadcast ring of one group: hops in member order."""

    receivers: int
    intra_hops: int  # hops inside an NVLink domain
    net_hops: int  # hops between NVLink domains
    min_rails: int  # fewest members on either end of a network hop (rails a multi-channel ring can use)
    by_link: tuple[int, int, int]  # hops per link class (intra_node, intra_domain, cross_domain)


@dataclass(frozen=True)
class BucketStats:
    nbytes: np.ndarray  # [B] bucket payload bytes
    root_nic_recv: np.ndarray  # [B] gather bytes reaching the root over its NIC
    root_nvl_recv: np.ndarray  # [B] ... over NVLink
    send_nic_max: np.ndarray  # [B] the busiest gather sender's NIC bytes
    send_nvl_max: np.ndarray  # [B]
    node_send_max: np.ndarray  # [B] the busiest node's gather bytes leaving over its NICs
    root_msgs: np.ndarray  # [B] messages the root receives
    root_copy: np.ndarray  # [B] bytes the root copies into the bucket (own pieces, staged pieces)
    gather_send_total: np.ndarray  # [B] bytes all senders (root excluded) send
    rings: tuple[Ring, ...]  # distinct rings
    ring_of: np.ndarray  # [B] index into rings
    held_full_max: np.ndarray  # [B] the busiest inference rank's bytes of bucket tensors it holds part of
    held_slice_max: np.ndarray  # [B] ... bytes of its own slices
    held_full_total: np.ndarray  # [B] over all inference ranks
    held_slice_total: np.ndarray  # [B]
    link_bytes: np.ndarray  # [3] bytes per link class (gathers + broadcast rings)
    gather_sent: np.ndarray  # [world] bytes each rank sends to roots over all buckets (in place from its arena)


def _ring(plan: Plan, group: tuple[int, ...]) -> Ring:
    topo = plan.topology
    node, dom = topo.node_of, topo.domain_of
    members = np.asarray(group, dtype=np.int64)
    per_node = np.bincount(node[members], minlength=int(node.max()) + 1)
    a, c = members[:-1], members[1:]  # the hops, in member order
    same_dom = dom[a] == dom[c]
    same_node = node[a] == node[c]
    net = ~same_dom
    rails = int(np.minimum(per_node[node[a[net]]], per_node[node[c[net]]]).min()) if net.any() else 1
    by_link = (int((same_dom & same_node).sum()), int((same_dom & ~same_node).sum()), int(net.sum()))
    return Ring(len(group) - 1, int(same_dom.sum()), int(net.sum()), rails or 1, by_link)


def _holder_matrices(plan: Plan, tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per inference placement class (``placement_classes``: a few dozen even for DeepSeek-V3's 45k
    tensors): which ranks hold part of it, and the fraction of the tensor each holds (a rank's fractions
    added in slot order); and each of ``tensors``' class (its row), in their order."""
    classes, reps = plan.infer.placement_classes()
    I = plan.infer_world
    held, frac = np.zeros((len(reps), I)), np.zeros((len(reps), I))
    for c, p in enumerate(reps):
        tpl = p.template
        n = tpl.slot_numels()
        some = n > 0
        ranks = np.asarray(p.ranks, dtype=np.int64)[some]
        held[c, ranks] = 1.0
        np.add.at(frac[c], ranks, n[some] / max(1, int(np.prod(tpl.shape))))
    return classes[tensors], held, frac


def _contiguous_in_tensor(box, shape) -> bool:
    """Is ``box`` one contiguous byte range of the full tensor (row-major)?"""
    d = 0
    while d < len(shape) and box[d][1] - box[d][0] == 1:
        d += 1
    return all(box[j] == (0, shape[j]) for j in range(d + 1, len(shape)))


def bucket_stats(plan: Plan) -> BucketStats:
    B = len(plan.buckets)
    topo = plan.topology
    node, dom = topo.node_of, topo.domain_of
    model = plan.model
    names = ("root_nic_recv", "root_nvl_recv", "send_nic_max", "send_nvl_max", "node_send_max", "root_msgs",
             "root_copy", "gather_send_total")
    f = {k: [0.0] * B for k in names}  # Python floats (exact: integers far below 2**53), arrays at the end
    root_nic_recv, root_nvl_recv, send_nic_max, send_nvl_max, node_send_max, root_msgs, root_copy, send_total = (
        f[k] for k in names)
    rings: dict[tuple[int, ...], int] = {}
    ring_by_id: dict[int, int] = {}  # the buckets keep their groups alive
    ring_of = np.zeros(B, dtype=np.int64)
    link_bytes = np.zeros(3)
    gather_sent = np.zeros(plan.world)
    all_tensors = np.fromiter((i for b in plan.buckets for i in b.tensors), dtype=np.int64)
    pl_of, held, frac = _holder_matrices(plan, all_tensors)
    per_pl = np.zeros((B, held.shape[0]))
    contig: dict[tuple, tuple[bool, bool]] = {}
    node_l, dom_l = node.tolist(), dom.tolist()
    for k, b in enumerate(plan.buckets):
        root = b.root
        node_send: dict[int, float] = {}
        for pr in b.gather:
            nb = pr.nbytes
            if pr.peer == root:
                root_copy[k] += nb
                continue
            # a trainer's pieces are whole boxes of its own (in place in its arena, first-use order); at
            # the root, whole tensors lie back to back in the bucket (in place), other pieces are staged
            # and copied in; one message per class (contiguous in the tensor or not, wire.py)
            classes = set()
            for r in pr.regions:
                key = (r.tensor, r.box)
                c = contig.get(key)
                if c is None:
                    shape = model.tensors[r.tensor].shape
                    c = contig[key] = (_contiguous_in_tensor(r.box, shape), r.box == tuple((0, n) for n in shape))
                classes.add(c[0])
                if not c[1]:
                    root_copy[k] += r.nbytes  # staged at the root, copied into the bucket
            root_msgs[k] += len(classes)
            send_total[k] += nb
            gather_sent[pr.peer] += nb
            peer_node = node_l[pr.peer]
            if dom_l[pr.peer] != dom_l[root]:
                root_nic_recv[k] += nb
                send_nic_max[k] = max(send_nic_max[k], nb)
                node_send[peer_node] = node_send.get(peer_node, 0.0) + nb
                link_bytes[2] += nb
            else:
                root_nvl_recv[k] += nb
                send_nvl_max[k] = max(send_nvl_max[k], nb)
                link_bytes[0 if peer_node == node_l[root] else 1] += nb
        if node_send:
            node_send_max[k] = max(node_send.values())
        g = b.group
        ri = ring_by_id.get(id(g))  # buckets share group tuples: hash 270 ranks once per tuple, not per bucket
        if ri is None:
            ri = rings.get(g)
            if ri is None:
                ri = rings[g] = len(rings)
            ring_by_id[id(g)] = ri
        ring_of[k] = ri
    f = {k: np.asarray(v, dtype=np.float64) for k, v in f.items()}
    # bytes of every bucket per inference placement (integers: exact whatever the order)
    bucket_of = np.repeat(np.arange(B), [len(b.tensors) for b in plan.buckets])
    np.add.at(per_pl, (bucket_of, pl_of), model.nbytes_array[all_tensors].astype(np.float64))
    ring_list = [None] * len(rings)
    for g, ri in rings.items():
        ring_list[ri] = _ring(plan, g)
    nbytes = np.asarray([b.nbytes for b in plan.buckets], dtype=np.float64)
    ring_bytes = np.bincount(ring_of, weights=nbytes, minlength=len(ring_list))  # integers: exact in any order
    for k in range(3):
        link_bytes[k] += float(sum(ring_bytes[ri] * r.by_link[k] for ri, r in enumerate(ring_list)))
    full = per_pl @ held if B else np.zeros((0, plan.infer_world))
    sl = per_pl @ frac if B else np.zeros((0, plan.infer_world))
    return BucketStats(
        nbytes=nbytes, rings=tuple(ring_list), ring_of=ring_of,
        held_full_max=full.max(axis=1) if full.size else np.zeros(B),
        held_slice_max=sl.max(axis=1) if sl.size else np.zeros(B),
        held_full_total=full.sum(axis=1), held_slice_total=sl.sum(axis=1), link_bytes=link_bytes,
        gather_sent=gather_sent, **f,
    )
