"""Will the ranks of a local run fit in this machine's memory? Checked before any process starts.

Per rank (every rank is a process on this machine, weights on the CPU):

* trainer rank: the bytes of its source boxes (the weights it sends);
* inference rank: twice the bytes of its destination boxes (the weights it serves and the staged copy
  the commit protocol receives into);
* every rank: its transient buffer pool, at most ``max(4 x bucket, 64 MiB)`` (runtime/worker.py), and the
  process itself with torch imported (``PROCESS_BYTES``, measured: ~220 MiB RSS with torch 2.13 CPU).

The sum is compared with ``MemAvailable`` (/proc/meminfo) less a 10 % reserve; a run that does not fit
is refused with the arithmetic (``InputError``, exit 2). When the ranks run on GPUs (NCCL, one GPU per
rank), each rank's weights, pool and NCCL's own buffers (``nccl_bytes``) are compared with its GPU's
free memory instead (same reserve), and only the processes with the host's.

NCCL's buffers per GPU (an estimate from NCCL's documented defaults, capped by the site's ``nccl:``
keys; docs/gpu.md "NCCL memory"):

* point-to-point: every connected direction (the program's peers over every plan of the session,
  ``preconnect.program_peers``; the pre-connect connects exactly these) holds ``p2p_channels_per_peer``
  channels of ``NCCL_BUFFSIZE`` each;
* collectives: every communicator the rank is in (the data group, each broadcast sub-group of the
  session's plans, and under the API its own second world communicator) holds up to ``max_channels``
  channels, each with a send and a receive connection of about two ``NCCL_BUFFSIZE`` buffers (the
  SIMPLE protocol's and LL128's; LL's is small).
"""

from __future__ import annotations

from reshardctl.errors import InputError
from reshardctl.layout.placement import box_numel
from reshardctl.topology import infer_rank_of, is_trainer

PROCESS_BYTES = 256 << 20
RING_CONNECTIONS = 2  # per channel of a communicator: the ring's send and receive neighbour
PROTOCOL_BUFFERS = 2  # per connection: SIMPLE (NCCL_BUFFSIZE) and LL128 (about as much); LL's is small
RESERVE = 0.10
GiB = float(1 << 30)


def _holding_bytes(model, holdings) -> int:
    return sum(box_numel(b) * model.tensors[i].itemsize for i, boxes in holdings.items() for b in boxes)


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def needed_bytes(plan) -> dict:
    """The arithmetic for one plan: weights, staging, pools, processes, total."""
    m, T, I = plan.model, plan.train_world, plan.infer_world
    src = sum(_holding_bytes(m, plan.src_holdings(r)) for r in range(T))
    dst = sum(_holding_bytes(m, plan.dst_holdings(r)) for r in range(I))
    pool = (T + I) * max(4 * plan.bucket_bytes, 64 << 20)
    procs = (T + I) * PROCESS_BYTES
    return {"trainer_weights": src, "inference_weights": dst, "inference_staging": dst, "pools": pool,
            "processes": procs, "total": src + 2 * dst + pool + procs}


def rank_bytes(plan, rank: int) -> int:
    """One rank's weights (inference: served + staged) and buffer pool."""
    T = plan.train_world
    pool = max(4 * plan.bucket_bytes, 64 << 20)
    if is_trainer(rank, T):
        return _holding_bytes(plan.model, plan.src_holdings(rank)) + pool
    return 2 * _holding_bytes(plan.model, plan.dst_holdings(infer_rank_of(rank, T))) + pool


def nccl_bytes(plans, rank: int, nccl=None, *, api: bool = False) -> dict:
    """NCCL's own device memory on ``rank``'s GPU for a session of ``plans`` (a list or dict of plans),
    with the site's caps (``NcclSpec``; NCCL's defaults when None): the arithmetic and its total."""
    from reshardctl.runtime.groups import broadcast_groups
    from reshardctl.runtime.preconnect import program_peers
    from reshardctl.site.spec import NcclSpec

    nccl = NcclSpec() if nccl is None else nccl
    plans = list(plans.values()) if isinstance(plans, dict) else list(plans)
    world = plans[0].train_world + plans[0].infer_world
    sends, recvs = program_peers(plans, rank)
    directions = len(sends) + len(recvs)
    subgroups = sum(1 for g in broadcast_groups(plans) if rank in g and len(g) < world)
    communicators = 1 + subgroups + (1 if api else 0)
    buf = nccl.buffsize_bytes
    p2p = directions * nccl.p2p_channels_per_peer * buf
    collectives = communicators * nccl.max_channels * RING_CONNECTIONS * PROTOCOL_BUFFERS * buf
    return {"p2p_directions": directions, "communicators": communicators, "p2p": p2p,
            "collectives": collectives, "total": p2p + collectives}


def check_gpu_memory(plans: dict, free_bytes, nccl=None) -> None:
    """Per rank on its own GPU (``free_bytes(rank)``): weights, pool and NCCL's buffers (``nccl_bytes``
    of the whole session: every plan's groups exist at once); raise ``InputError`` naming every rank that
    cannot fit."""
    bad = []
    world = next(iter(plans.values())).train_world + next(iter(plans.values())).infer_world
    for r in range(world):
        comm = nccl_bytes(plans, r, nccl)
        for p in plans.values():
            need, free = rank_bytes(p, r) + comm["total"], free_bytes(r)
            if need > free * (1 - RESERVE):
                bad.append(f"rank {r}: {need / GiB:.1f} GiB (weights{' x 2' if not is_trainer(r, p.train_world) else ''} + pool "
                           f"+ NCCL {comm['total'] / GiB:.2f} GiB: {comm['p2p_directions']} p2p directions, "
                           f"{comm['communicators']} communicator(s)) "
                           f"> {free * (1 - RESERVE) / GiB:.1f} GiB free on cuda:{r} after a {RESERVE:.0%} reserve")
                break
    if bad:
        raise InputError("the ranks of this run do not fit on their GPUs; nothing was started: " + "; ".join(bad[:8]))


def check_memory(plans: dict, available: int | None = None, *, gpus: bool = False, nccl=None) -> dict:
    """Raise ``InputError`` with the arithmetic when the largest of ``plans`` cannot fit; returns it.
    ``gpus``: the weights live on one GPU per rank (checked there with NCCL's buffers under the site's
    ``nccl`` caps; only the processes count here)."""
    need = max((needed_bytes(p) for p in plans.values()), key=lambda x: x["total"])
    if gpus:
        import torch

        check_gpu_memory(plans, lambda r: torch.cuda.mem_get_info(r)[0], nccl)
        need = {**need, "trainer_weights": 0, "inference_weights": 0, "inference_staging": 0, "pools": 0,
                "total": need["processes"]}
    avail = available_bytes() if available is None else available
    if avail is None:
        return need
    usable = int(avail * (1 - RESERVE))
    if need["total"] > usable:
        p = next(iter(plans.values()))
        raise InputError(
            f"the ranks of this run need about {need['total'] / GiB:.1f} GiB but this machine has "
            f"{avail / GiB:.1f} GiB available ({usable / GiB:.1f} GiB after a {RESERVE:.0%} reserve): "
            f"trainer weights {need['trainer_weights'] / GiB:.1f} GiB + inference weights "
            f"{need['inference_weights'] / GiB:.1f} GiB x 2 (served + staged) + buffer pools "
            f"{need['pools'] / GiB:.1f} GiB + {p.train_world + p.infer_world} processes x "
            f"{PROCESS_BYTES / GiB:.2f} GiB; nothing was started",
            hint="choose a smaller model (--layers) or fewer ranks, or plan it with `reshardctl plan`",
        )
    return need
