"""What a refit holds on each GPU, per plan (pure; vectorised over placement classes, no rank program):

* an inference rank: the weights it serves and the **staged copy** the all-or-nothing commit receives
  into (a second copy of every byte the rank holds: the old weights stay servable until every rank
  voted), its transient buffer pool, NCCL's own buffers;
* a trainer rank: what the refit adds to its own memory: the pool and NCCL's buffers.

The pool is counted at the limit the runtime gives its buffer pool, ``max(4 x bucket, 64 MiB)``
(``pool_limit_bytes``, read by runtime/worker.py and the API). NCCL's buffers are an estimate from NCCL's documented defaults under the site's
``nccl:`` caps (docs/gpu.md, "NCCL memory"): every connected point-to-point direction holds
``p2p_channels_per_peer`` channels of ``NCCL_BUFFSIZE``; every communicator the rank is in (the data
group, each broadcast sub-group it belongs to) up to ``max_channels`` channels, each with a send and a
receive connection of about two ``NCCL_BUFFSIZE`` buffers (SIMPLE and LL128; LL's is small). The
directions are the program's own (``runtime.preconnect.program_peers``: rounds, relays, the gathers of
broadcast buckets), counted here from the plan's tables. The busiest rank of each side is compared with
the site's ``gpu_memory_gib`` where the profile gives it, after ``RESERVE``.
"""

from __future__ import annotations

import math

import numpy as np

from reshardctl.plan.distinct import distinct

POOL_FLOOR = 64 << 20
RING_CONNECTIONS = 2  # per channel of a communicator: the ring's send and receive neighbour
PROTOCOL_BUFFERS = 2  # per connection: SIMPLE (NCCL_BUFFSIZE) and LL128 (about as much); LL's is small
RESERVE = 0.10  # of a GPU's memory kept free (the CUDA context, the allocator's fragmentation)


def pool_limit_bytes(bucket_bytes: int) -> int:
    """The limit of a rank's transient buffer pool (``BufferPool(limit_bytes=...)``) for this bucket bound."""
    return max(4 * int(bucket_bytes), POOL_FLOOR)


def nccl_buffer_bytes(directions, communicators, nccl) -> tuple:
    """NCCL's buffers for ``directions`` connected p2p directions and ``communicators`` communicators
    (ints or int arrays) under the caps ``nccl`` (``site.spec.NcclSpec``): (p2p, collectives)."""
    buf = nccl.buffsize_bytes
    return (directions * nccl.p2p_channels_per_peer * buf,
            communicators * nccl.max_channels * RING_CONNECTIONS * PROTOCOL_BUFFERS * buf)


def held_bytes(model, layout) -> np.ndarray:
    """Per side-local rank of ``layout``: the bytes of every box it holds (int64)."""
    classes, reps = layout.placement_classes()
    per_class = np.bincount(classes, weights=model.itemsizes, minlength=len(reps))  # itemsize summed per class
    out = np.zeros(layout.world_size, dtype=np.float64)  # integer-valued, far below 2**53: exact
    for c, p in enumerate(reps):
        numels = p.template.slot_numels()
        if numels.size:
            out += np.bincount(np.asarray(p.ranks, dtype=np.int64), weights=numels,
                               minlength=layout.world_size)[:layout.world_size] * per_class[c]
    return out.astype(np.int64)


def _plans(plans) -> list:
    return list(plans.values()) if isinstance(plans, dict) else list(plans) if isinstance(plans, (list, tuple)) \
        else [plans]


def p2p_directions(plans) -> tuple[np.ndarray, np.ndarray]:
    """Per global rank: how many peers it sends to and how many it receives from, over the rounds (every
    unit's table, relays included) and the gathers of broadcast buckets (a root's own pieces are no
    connection) of a plan, or of a session's plans (a list or dict: their union). The counts of
    ``program_peers`` for every rank at once."""
    plans = _plans(plans)
    world = plans[0].world
    keys = [t.src.astype(np.int64) * world + t.dst for pl in plans for t in (u.table for u in pl.units) if len(t)]
    gathers = [(g.peer, b.root) for pl in plans for b in pl.buckets for g in b.gather if g.peer != b.root]
    if gathers:
        pairs = np.asarray(gathers, dtype=np.int64)
        keys.append(pairs[:, 0] * world + pairs[:, 1])
    sends = np.zeros(world, dtype=np.int64)
    recvs = np.zeros(world, dtype=np.int64)
    if keys:
        src, dst = np.divmod(distinct(np.concatenate(keys)).values, world)  # (no transfer is a rank's to itself)
        sends += np.bincount(src, minlength=world)
        recvs += np.bincount(dst, minlength=world)
    return sends, recvs


def communicators(plans) -> np.ndarray:
    """Per global rank: the NCCL communicators it is in, the data group and each broadcast sub-group of the
    plan (or the session's plans) that has it (a group of every rank is the data group itself)."""
    plans = _plans(plans)
    world = plans[0].world
    out = np.ones(world, dtype=np.int64)
    for g in sorted({g for pl in plans for g in pl.broadcast_groups()}):
        if len(g) < world:
            out[np.asarray(g, dtype=np.int64)] += 1
    return out


def gpu_memory(plans, nccl, gpu_bytes: int | None = None) -> dict:
    """The busiest inference rank (weights + staged copy + pool + NCCL) and the busiest trainer rank (what
    the refit adds: pool + NCCL) of a plan, or of a session's plans (every plan's connections and groups
    exist at once; the pool is the largest bucket's), with the arithmetic; against ``gpu_bytes`` per GPU
    where given: ``fits`` (the inference rank's total within the GPU less ``RESERVE``), what is left there
    for the engine's KV cache and activations, and ``max_engine_memory_utilization``: the largest fraction
    of a GPU (vLLM's ``gpu_memory_utilization``, floored to 0.01) an engine may take with the refit's own
    bytes (staged copy, pool, NCCL) of every inference rank beside it. Global rank numbers."""
    plans = _plans(plans)
    plan = plans[0]
    T = plan.train_world
    sends, recvs = p2p_directions(plans)
    directions = sends + recvs
    comms = communicators(plans)
    p2p, coll = nccl_buffer_bytes(directions, comms, nccl)
    nccl_total = p2p + coll
    pool = pool_limit_bytes(max(pl.bucket_bytes for pl in plans))
    weights = held_bytes(plan.model, plan.infer)
    infer_total = 2 * weights + pool + nccl_total[T:]
    i = int(np.argmax(infer_total))
    t = int(np.argmax(nccl_total[:T]))

    def side(rank: int) -> dict:
        return {"p2p_directions": int(directions[rank]), "communicators": int(comms[rank]),
                "p2p_bytes": int(p2p[rank]), "collective_bytes": int(coll[rank]), "bytes": int(nccl_total[rank])}

    refit_own = infer_total - weights  # the staged copy, pool and NCCL: beside the engine, outside its budget
    out = {
        "inference": {"rank": T + i, "side_rank": i, "weights_bytes": int(weights[i]), "staged_copy_bytes": int(weights[i]),
                      "pool_bytes": pool, "nccl": side(T + i), "total_bytes": int(infer_total[i]),
                      "refit_bytes": int(refit_own[i])},
        "trainer": {"rank": t, "side_rank": t, "pool_bytes": pool, "nccl": side(t), "refit_bytes": pool + int(nccl_total[t])},
        "gpu_bytes": gpu_bytes, "reserve": RESERVE, "fits": None, "inference_left_bytes": None,
        "max_engine_memory_utilization": None,
    }
    if gpu_bytes is not None:
        usable = int(gpu_bytes * (1 - RESERVE))
        out["fits"] = int(infer_total[i]) <= usable
        out["inference_left_bytes"] = usable - int(infer_total[i])
        # the largest fraction of a GPU an engine may take (vLLM's gpu_memory_utilization: its weights,
        # activations and KV cache) with the refit's own bytes of the rank needing most beside it
        out["max_engine_memory_utilization"] = max(0.0, math.floor(100 * (gpu_bytes - int(refit_own.max())) / gpu_bytes) / 100)
    return out
