"""Gather-and-broadcast, the rollback baseline, in its strongest published form.

Per trainer pipeline stage, every tensor is broadcast from one *root*: a stage rank that holds the
whole tensor when there is one (expert-parallel experts from their owner, replicated tensors spread
over their holders: no gather), else the stage leader (its lowest trainer rank), which gathers the
tensor's shards first. A root packs its tensors into buckets and broadcasts each to every inference
rank, which keeps its own slice. Like the RL stacks' two alternating buffers, the pipeline holds two
buckets at once (broadcasting one while gathering the next), so a bucket is at most HALF of
``bucket_bytes`` and the staging bound holds; a tensor larger than that goes alone (this transport
needs a full-tensor temporary on its root, one of its known costs).

``span`` chooses the broadcast group: ``"stage"`` (GPU sites) puts every trainer rank of the stage in
it, as NeMo RL's packed broadcast does, so NCCL builds its rings through every GPU, and every NIC, of
the source nodes; ``"root"`` (cpu_only sites, where every member is one more copy through the host)
holds the root and the inference ranks only.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from reshardctl.layout.placement import ShardTemplate, full_box
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec, TensorSpec
from reshardctl.plan.pairs import intersect_templates
from reshardctl.plan.routing import route
from reshardctl.plan.schedule import BroadcastBucket, PeerRegions, Region
from reshardctl.topology import Topology

SPANS = ("root", "stage")


def build_buckets(
    model: ModelSpec,
    train: SideLayout,
    topo: Topology,
    bucket_bytes: int,
    *,
    first_index: int = 0,
    select: Callable[[TensorSpec], bool] | None = None,
    span: str = "root",
) -> list[BroadcastBucket]:
    if span not in SPANS:
        raise ValueError(f"broadcast span {span!r}: expected one of {', '.join(SPANS)}")
    infer_group = tuple(range(topo.train_world, topo.world))
    tcls, reps = train.placement_classes()  # a class: one template object on the same ranks
    stage_of = train.stage_array()
    index_all = np.arange(len(model.tensors))
    if select is not None:
        index_all = index_all[np.fromiter(map(select, model.tensors), dtype=bool, count=len(model.tensors))]
    stages = np.flatnonzero(np.bincount(stage_of[index_all])) if index_all.size else ()  # (np.unique hashes)
    by_stage = {int(s): index_all[stage_of[index_all] == s].tolist() for s in stages}
    cls_of = tcls.tolist()
    full_templates: dict[tuple[int, ...], ShardTemplate] = {}
    piece_cache: dict[tuple[int, int, int], list[tuple[int, tuple, int]]] = {}

    def gather_pieces(i: int, leader: int) -> list[tuple[int, tuple, int]]:
        """(source rank, box, bytes) covering tensor i once, routed to the leader; cached per placement
        class (one template: one shape) and itemsize."""
        t = model.tensors[i]
        key = (cls_of[i], leader, t.itemsize)
        got = piece_cache.get(key)
        if got is None:
            sp = reps[cls_of[i]]
            tpl = full_templates.setdefault(t.shape, ShardTemplate(t.shape, ((full_box(t.shape),),)))
            pieces = intersect_templates(sp.template, tpl, t.name)
            table = route(pieces, np.asarray(sp.ranks, np.int32), np.asarray([leader], np.int32), topo, t.itemsize)
            got = piece_cache[key] = [
                (int(table.src[k]), tuple(zip(table.lo[k].tolist(), table.hi[k].tolist())), int(table.nbytes[k]))
                for k in range(len(table))
            ]
        return got

    # per placement class of the selected tensors: the trainer ranks holding the tensor whole
    whole_by_class: dict[int, tuple[int, ...]] = {}
    for i in index_all.tolist():
        c = cls_of[i]
        if c not in whole_by_class:
            full = (full_box(model.tensors[i].shape),)
            whole_by_class[c] = tuple(sorted({r for r, h in reps[c].items() if tuple(h) == full}))
    holders_of = [whole_by_class.get(c, ()) for c in cls_of]
    has_holders = [bool(h) for h in holders_of]
    tensor_bytes = [t.nbytes for t in model.tensors]
    # each tensor's whole box, one box object per distinct shape (the regions of a tensor's holder share it)
    boxes_of_shape: dict[tuple[int, ...], tuple] = {}
    whole_box = [boxes_of_shape.get(t.shape) or boxes_of_shape.setdefault(t.shape, full_box(t.shape))
                 for t in model.tensors]
    region = tuple.__new__  # Region(i, box, nbytes) without its Python-level __new__ (45k regions: a third of this pass)

    buckets: list[BroadcastBucket] = []
    index = first_index
    for stage in sorted(by_stage):
        stage_ranks = tuple(sorted(train.stage_ranks(stage)))
        leader = stage_ranks[0]
        current: dict[int, list[int]] = {}  # root -> tensors of its open bucket
        size: dict[int, int] = {}
        spread = 0  # rotates replicated tensors over their holders
        groups: dict[int, tuple[int, ...]] = {}  # root -> its broadcast group (one tuple, shared by its buckets)

        def flush(root: int) -> None:
            nonlocal index
            tensors = current.pop(root, [])
            nbytes = size.pop(root, 0)
            if not tensors:
                return
            if all(map(has_holders.__getitem__, tensors)):  # the root holds every tensor whole: no gather
                own = tuple([region(Region, (i, whole_box[i], tensor_bytes[i])) for i in tensors])
                peers = (PeerRegions(root, own),)
            else:
                peers = _gathered(tensors, root)
            group = groups.get(root)
            if group is None:
                others = tuple(r for r in stage_ranks if r != root) if span == "stage" else ()
                group = groups[root] = (root,) + others + infer_group
            buckets.append(BroadcastBucket(index=index, root=root, group=group, tensors=tuple(tensors),
                                           gather=peers, nbytes=nbytes))
            index += 1

        def _gathered(tensors: list[int], root: int) -> tuple[PeerRegions, ...]:
            """Each source rank's regions of ``tensors`` for ``root``, by rank (the root's own included)."""
            gather: dict[int, list[Region]] = {}
            for i in tensors:
                if holders_of[i]:  # then its root is one of them
                    own = gather.get(root)
                    if own is None:
                        own = gather[root] = []
                    own.append(region(Region, (i, whole_box[i], tensor_bytes[i])))
                    continue
                for src, box, nb in gather_pieces(i, root):
                    gather.setdefault(src, []).append(region(Region, (i, box, nb)))
            return tuple(PeerRegions(p, tuple(r)) for p, r in sorted(gather.items()))

        half = bucket_bytes // 2
        for i in by_stage[stage]:
            holders = holders_of[i]
            if not holders:
                root = leader
            elif len(holders) > 1:
                root = holders[spread % len(holders)]
                spread += 1
            else:
                root = holders[0]
            nb = tensor_bytes[i]
            open_ = current.get(root)
            if open_ and size[root] + nb > half:
                flush(root)
                open_ = None
            if open_ is None:
                current[root] = [i]
                size[root] = nb
            else:
                open_.append(i)
                size[root] += nb
        for root in sorted(current):
            flush(root)
    return buckets
