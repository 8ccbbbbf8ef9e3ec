"""Gather-and-broadcast, the rollback baseline, as today's RL stacks do it.

Per trainer pipeline stage: the stage leader (its lowest trainer rank) gathers full tensors from the
stage's shards, packs them into buckets and broadcasts each bucket to every inference rank, which
keeps its own slice. Like the RL stacks' two alternating buffers, the pipeline holds two buckets at
once (broadcasting one while gathering the next), so a bucket is at most HALF of ``bucket_bytes`` and
the staging bound holds; a tensor larger than that goes alone (this transport needs a full-tensor
temporary on the leader, one of its known costs).
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


def build_buckets(
    model: ModelSpec,
    train: SideLayout,
    topo: Topology,
    bucket_bytes: int,
    *,
    first_index: int = 0,
    select: Callable[[TensorSpec], bool] | None = None,
) -> list[BroadcastBucket]:
    infer_group = tuple(range(topo.train_world, topo.world))
    by_stage: dict[int, list[int]] = {}
    for i, t in enumerate(model.tensors):
        if select is None or select(t):
            by_stage.setdefault(train.stage_of(i), []).append(i)
    full_templates: dict[tuple[int, ...], ShardTemplate] = {}
    piece_cache: dict[tuple[int, int, int], list[tuple[int, tuple, int]]] = {}
    keep = []  # placements stay referenced, so their ids are stable

    def gather_pieces(i: int, leader: int) -> list[tuple[int, tuple, int]]:
        """(source rank, box, bytes) covering tensor i once, routed to the leader; cached per placement."""
        t = model.tensors[i]
        sp = train.placement(i)
        key = (id(sp), leader, t.itemsize)
        got = piece_cache.get(key)
        if got is None:
            keep.append(sp)
            tpl = full_templates.setdefault(t.shape, ShardTemplate(t.shape, ((full_box(t.shape),),)))
            pieces = intersect_templates(sp.template, tpl, t.name)
            table = route(pieces, np.asarray(sp.ranks, np.int32), np.asarray([leader], np.int32), topo, t.itemsize)
            got = piece_cache[key] = [
                (int(table.src[k]), tuple(zip(table.lo[k].tolist(), table.hi[k].tolist())), int(table.nbytes[k]))
                for k in range(len(table))
            ]
        return got

    buckets: list[BroadcastBucket] = []
    index = first_index
    for stage in sorted(by_stage):
        leader = min(train.stage_ranks(stage))
        current: list[int] = []
        size = 0

        def flush() -> None:
            nonlocal current, size, index
            if not current:
                return
            gather: dict[int, list[Region]] = {}
            for i in current:
                for src, box, nb in gather_pieces(i, leader):
                    gather.setdefault(src, []).append(Region(i, box, nb))
            buckets.append(
                BroadcastBucket(
                    index=index,
                    root=leader,
                    group=(leader,) + infer_group,
                    tensors=tuple(current),
                    gather=tuple(PeerRegions(p, tuple(r)) for p, r in sorted(gather.items())),
                    nbytes=size,
                )
            )
            index += 1
            current, size = [], 0

        for i in by_stage[stage]:
            nb = model.tensors[i].nbytes
            if current and size + nb > bucket_bytes // 2:
                flush()
            current.append(i)
            size += nb
        flush()
    return buckets
