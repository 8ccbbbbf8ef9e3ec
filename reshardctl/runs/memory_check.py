"""Will the ranks of a local run fit in this machine's memory? Checked before any process starts.

Per rank (every rank is a process on this machine, weights on the CPU):

* trainer rank: the bytes of its source boxes (the weights it sends);
* inference rank: twice the bytes of its destination boxes (the weights it serves and the staged copy
  the commit protocol receives into);
* every rank: its transient buffer pool, at most ``max(4 x bucket, 64 MiB)`` (runtime/worker.py), and the
  process itself with torch imported (``PROCESS_BYTES``, measured: ~220 MiB RSS with torch 2.13 CPU).

The sum is compared with ``MemAvailable`` (/proc/meminfo) less a 10 % reserve; a run that does not fit
is refused with the arithmetic (``InputError``, exit 2). When the ranks run on GPUs (NCCL, one GPU per
rank), each rank's weights and pool are compared with its GPU's free memory instead (same reserve),
and only the processes with the host's.
"""

from __future__ import annotations

from reshardctl.errors import InputError
from reshardctl.layout.placement import box_numel
from reshardctl.topology import infer_rank_of, is_trainer

PROCESS_BYTES = 256 << 20
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


def check_gpu_memory(plans: dict, free_bytes) -> None:
    """Per rank on its own GPU (``free_bytes(rank)``): raise ``InputError`` naming every rank that cannot fit."""
    bad = []
    for p in plans.values():
        for r in range(p.train_world + p.infer_world):
            need, free = rank_bytes(p, r), free_bytes(r)
            if need > free * (1 - RESERVE):
                bad.append(f"rank {r}: {need / GiB:.1f} GiB (weights{' x 2' if not is_trainer(r, p.train_world) else ''} + pool) "
                           f"> {free * (1 - RESERVE) / GiB:.1f} GiB free on cuda:{r} after a {RESERVE:.0%} reserve")
    if bad:
        raise InputError("the ranks of this run do not fit on their GPUs; nothing was started: " + "; ".join(bad[:8]))


def check_memory(plans: dict, available: int | None = None, *, gpus: bool = False) -> dict:
    """Raise ``InputError`` with the arithmetic when the largest of ``plans`` cannot fit; returns it.
    ``gpus``: the weights live on one GPU per rank (checked there; only the processes count here)."""
    need = max((needed_bytes(p) for p in plans.values()), key=lambda x: x["total"])
    if gpus:
        import torch

        check_gpu_memory(plans, lambda r: torch.cuda.mem_get_info(r)[0])
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
