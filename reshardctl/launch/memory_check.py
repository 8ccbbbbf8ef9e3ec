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

On Slurm (``check_slurm_memory``) the ranks run on the allocation's nodes: per role, the busiest node's
ranks (the same per-rank bytes, weights only where the ranks hold them on the host: ``cpu_only`` sites,
gloo) are compared with what the profile asks for that role (``mem`` per node, or ``mem_per_cpu`` x
CPUs per task x tasks on the node; ``mem: 0``, all of a node, and no request are not checked) before
anything is submitted; the busiest node's bytes become the summary's ``memory_estimate_bytes``. On GPU
sites whose profile gives ``gpu_memory_gib`` the busiest inference rank's GPU memory is checked too
(``check_profile_gpu_memory``: weights, the staged copy, pool and NCCL's buffers against one GPU).

NCCL's buffers per GPU (an estimate from NCCL's documented defaults, capped by the site's ``nccl:``
keys; docs/gpu.md "NCCL memory"; the arithmetic is plan/gpu_memory.py's, which ``plan`` reports):

* point-to-point: every connected direction (the program's peers over every plan of the session,
  ``preconnect.program_peers``; the pre-connect connects exactly these) holds ``p2p_channels_per_peer``
  channels of ``NCCL_BUFFSIZE`` each;
* collectives: every communicator the rank is in (the data group, each broadcast sub-group of the
  session's plans, and under the API its own second world communicator) holds up to ``max_channels``
  channels, each with a send and a receive connection of about two ``NCCL_BUFFSIZE`` buffers (the
  SIMPLE protocol's and LL128's; LL's is small).
"""

from __future__ import annotations

from reshardctl.errors import InputError, ProfileError
from reshardctl.plan.gpu_memory import RESERVE, gpu_memory, nccl_buffer_bytes, pool_limit_bytes
from reshardctl.site.spec import size_bytes
from reshardctl.layout.placement import box_numel
from reshardctl.topology import infer_rank_of, is_trainer

PROCESS_BYTES = 256 << 20
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
    pool = (T + I) * pool_limit_bytes(plan.bucket_bytes)
    procs = (T + I) * PROCESS_BYTES
    return {"trainer_weights": src, "inference_weights": dst, "inference_staging": dst, "pools": pool,
            "processes": procs, "total": src + 2 * dst + pool + procs}


def rank_bytes(plan, rank: int) -> int:
    """One rank's weights (inference: served + staged) and buffer pool."""
    T = plan.train_world
    pool = pool_limit_bytes(plan.bucket_bytes)
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
    p2p, collectives = nccl_buffer_bytes(directions, communicators, nccl)
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


def slurm_node_bytes(plans, gpus_per_node: int, *, host_weights: bool) -> dict:
    """Per role, the bytes of its busiest node: ``{"train": (bytes, ranks on it), "infer": ...}`` for the
    largest of ``plans``. Ranks fill nodes ``gpus_per_node`` at a time (``slurm_request._component``).
    ``host_weights``: the ranks hold their weights in host memory (gloo on CPU), else only the processes."""
    plans = list(plans.values()) if isinstance(plans, dict) else list(plans)
    T, I = plans[0].train_world, plans[0].infer_world
    out = {}
    for role, first, count in (("train", 0, T), ("infer", T, I)):
        best = (0, 0)
        for node0 in range(0, count, gpus_per_node):
            ranks = range(first + node0, first + min(count, node0 + gpus_per_node))
            need = max(sum(PROCESS_BYTES + (rank_bytes(p, r) if host_weights else 0) for r in ranks) for p in plans)
            best = max(best, (need, len(ranks)))
        out[role] = best
    return out


def check_slurm_memory(plans, site, gpus_per_node: int) -> int:
    """Raise ``ProfileError`` when a role's busiest node needs more than the profile asks Slurm for (the key,
    the estimate and the request named); return the busiest node's bytes over both roles."""
    s = site.slurm
    nodes = slurm_node_bytes(plans, gpus_per_node, host_weights=site.cpu_only)
    bad = []
    for role, (need, ranks) in nodes.items():
        r = s.role_resources(role)
        own = s.resources.get(role)
        where = "slurm.resources." + role if own is not None and any(
            getattr(own, k) is not None for k in ("mem", "mem_per_cpu")) else "slurm"
        if r.mem is not None and size_bytes(r.mem):
            asked, how = size_bytes(r.mem), f"`{where}.mem` {r.mem} per node"
        elif r.mem_per_cpu is not None:
            cpus = r.cpus_per_task or 1
            asked = size_bytes(r.mem_per_cpu) * cpus * ranks
            how = f"`{where}.mem_per_cpu` {r.mem_per_cpu} x {cpus} CPU(s) per task x {ranks} tasks"
        else:
            continue
        if need > asked:
            bad.append(f"the {role} ranks' busiest node ({ranks} ranks) needs about {need / GiB:.2f} GiB "
                       f"({ranks} processes x {PROCESS_BYTES / GiB:.2f} GiB"
                       f"{' + their weights, pools and staging on the host (cpu_only)' if site.cpu_only else ''}) "
                       f"but {how} asks Slurm for {asked / GiB:.2f} GiB: {need} > {asked} bytes")
    if bad:
        raise ProfileError(f"site profile {site.source}: " + "; ".join(bad) + "; nothing was submitted",
                           hint="raise the memory request (slurm.mem / mem_per_cpu, or slurm.resources.<role>), "
                                "or plan fewer ranks per node")
    check_profile_gpu_memory(plans, site)
    return max(n for n, _ in nodes.values())


def check_profile_gpu_memory(plans, site) -> None:
    """GPU sites whose profile gives ``gpu_memory_gib``: raise ``ProfileError`` when the session's busiest
    inference rank (weights + the commit's staged copy + pool + NCCL's buffers of every plan's connections
    and groups, plan/gpu_memory.py) does not fit one GPU less the reserve: on Slurm the nodes' GPUs
    cannot be asked before the job runs, so the profile's figure is checked before anything is submitted."""
    if site.cpu_only or site.gpu_memory_bytes is None:
        return
    m = gpu_memory(plans, site.nccl, site.gpu_memory_bytes)
    if m["fits"]:
        return
    i, n = m["inference"], m["inference"]["nccl"]
    usable = int(m["gpu_bytes"] * (1 - m["reserve"]))
    raise ProfileError(
        f"site profile {site.source}: inference rank {i['side_rank']} needs {i['total_bytes'] / GiB:.2f} GiB per GPU "
        f"(weights {i['weights_bytes'] / GiB:.2f} + staged copy {i['staged_copy_bytes'] / GiB:.2f} + pool "
        f"{i['pool_bytes'] / GiB:.2f} + NCCL {n['bytes'] / GiB:.2f} GiB: {n['communicators']} communicator(s), "
        f"{n['p2p_directions']} p2p directions) but gpu_memory_gib {site.gpu_memory_gib:g} leaves "
        f"{usable / GiB:.2f} GiB after a {m['reserve']:.0%} reserve: {i['total_bytes']} > {usable} bytes; "
        f"nothing was submitted or written",
        hint="more inference ranks per replica (a larger tp: fewer weights per GPU), a smaller --bucket-mb, "
             "lower nccl: caps, or gpu_memory_gib set to the GPUs' real memory")
