"""Cost model v2: predicted refit seconds per transport, broken down by term (docs/cost-model.md).

Pure: the figures come in a ``Links`` built from the site profile's datasheet figures, or from a
calibration file read by the input layer (``request/resolve.py``). No fitted constants.

A step (a p2p round, or a bucket's gather / broadcast / unpack) costs, per term:

* ``wire``: its most loaded resource's bytes over the achievable bandwidth (nominal x efficiency, or
  measured): a GPU's NVLink or NIC per direction, a node's NICs together; a broadcast ring's slowest hop;
  on ``cpu_only`` sites also every byte through the host's loopback;
* ``latency``: one launch per grouped operation plus the busiest rank's messages x the per-message
  latency (messages of a rank progress ``msg_concurrency`` at a time);
* ``pack``: bytes copied into / out of packed buffers at the rank's copy rate (memory bandwidth / 2);
* ``checksum``: bytes checksummed (every region on both sides) at the checksum rate;
* ``sync``: the collectives that close a refit (the checksum exchange and the all-rank vote);
* ``landing``: after the commit, the committed bytes into the framework's parameters (one
  ``_foreach_copy_`` of every segment, ``api.Refitter._commit_copy``): the busiest inference rank's
  segments x the per-segment host cost + its bytes at the copy rate. ``Prediction.landing["loader_s"]`` is
  the same rank's landing through a framework's loader instead (one call per HF tensor), beside it.

Rounds are synchronous: each lasts as long as its slowest rank. Where the executor overlaps (GPU
sites: packing step k+1 and unpacking step k-1 while step k is on the wire) a step costs the larger of
its transfer and its copies; on ``cpu_only`` sites every term runs on the same shared cores, so terms
add up and a term's time is the larger of its busiest rank's work and all ranks' work over the cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from reshardctl.plan.bucket_stats import BucketStats, bucket_stats
from reshardctl.plan.refit_plan import Plan
from reshardctl.plan.stats import (
    MSGS, NIC_RECV, NIC_SEND, NVL_RECV, NVL_SEND, PACK_RECV, PACK_SEND, PlanStats, landing_counts, p2p_stats,
)

STEP_TERMS = ("wire", "latency", "pack", "checksum", "sync")  # what a step (round, bucket phase) costs
TERMS = STEP_TERMS + ("landing",)
NCCL_OPS_PER_CHANNEL = 8  # grouped p2p ops in flight per channel (NVIDIA/nccl #1028)
NCCL_OPS_PER_GROUP = 2048  # calls per group; larger groups split into several kernels (nccl #1028, #1768)
# host costs of a framework's load_weights (plan/engine_cost.py), measured on this repository's 2-core CPU machine by
# calibrate/landing.py host_cost (a calibration's mapping_s_per_entry / named_params_s_per_param replace them)
MAPPING_ENTRY_S = 40e-9  # one entry of a name-mapping scan (``if weight_name not in name: continue``)
NAMED_PARAM_S = 0.5e-6  # one parameter of ``dict(model.named_parameters())``


@dataclass(frozen=True)
class Links:
    """The cost model's figures: bandwidths in bytes/s per direction, times in seconds."""

    nvlink: float  # achievable NVLink bandwidth of a GPU (large messages)
    nic: float  # achievable bandwidth of one NIC
    node_nic: float  # all NICs of a node together
    nvlink_latency: float  # per message
    nic_latency: float
    launch: float = 0.0  # per grouped operation (one kernel / one gloo batch)
    copy: float = math.inf  # pack/unpack copy rate of one rank
    checksum: float = math.inf  # checksum rate of one rank
    host: float | None = None  # cpu_only: the loopback's aggregate rate (every byte is a copy through it)
    broadcast: float | None = None  # cpu_only: bytes a broadcast delivers per second (all receivers together)
    cores: int = 0  # cpu_only: cores every rank shares (0: not cpu_only)
    copy_all: float | None = None  # cpu_only: copy rate of one side's ranks together (sharing cores, memory)
    checksum_all: float | None = None  # cpu_only: checksum rate of one side's ranks together
    checksum_world: float | None = None  # cpu_only: checksum rate of both sides' ranks together (None: checksum_all)
    control: float | None = None  # cpu_only: seconds of one control round, an all-reduce of every rank (None: latencies)
    land_param: float = 0.0  # host seconds per parameter segment landed directly (one _foreach_copy_ of all)
    loader_call: float = 0.0  # host seconds per HF tensor through a framework loader call
    mapping_entry: float = MAPPING_ENTRY_S  # host seconds per entry of a loader's name-mapping scan (engine_cost.py)
    named_param: float = NAMED_PARAM_S  # host seconds per parameter of dict(model.named_parameters()) (engine_cost.py)
    msg_concurrency: int = 1  # messages of one rank in flight at once
    ops_per_launch: int = 1 << 30  # operations one launch carries (NCCL: 2048 per group)
    nics_per_node: int = 1
    peak_nvlink: float | None = None  # nominal figures for the lower bound (None: the achievable ones)
    peak_nic: float | None = None
    peak_node_nic: float | None = None
    peak_host: float | None = None
    source: str = "datasheet"  # "datasheet" or "calibration <file> (<date>)"
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for k, v in (("peak_nvlink", self.nvlink), ("peak_nic", self.nic), ("peak_node_nic", self.node_nic),
                     ("peak_host", self.host)):
            if getattr(self, k) is None:
                object.__setattr__(self, k, v)

    @classmethod
    def from_site(cls, site, measured=None, cores: int | None = None,
                  checksum_probe: tuple[float, str] | None = None) -> "Links":
        """Datasheet figures from the profile's ``links:``; a calibration (``site/measured.py``) replaces
        every figure it measured. Pure: ``measured`` was read, and ``cores`` (cpu_only sites: this
        machine's CPU count) and ``checksum_probe`` (cpu_only sites: one rank's checksum rate on this
        machine's chosen path, bytes/s, and its description; runtime/checksum_choice.py) found, by the
        caller. The probe replaces the ``mem / 4`` default where the profile sets no
        ``checksum_gbytes_per_s``, and a calibration's checksum figures where they were measured on
        another path than the one this machine now takes."""
        lk = site.links
        mem = lk.mem_gbytes_per_s * 1e9
        nvl_lat, nic_lat = lk.nvlink_latency_us * 1e-6, lk.nic_latency_us * 1e-6
        kw = dict(
            nvlink=lk.nvlink_bytes_per_s * lk.nvlink_efficiency, nic=lk.nic_bytes_per_s * lk.nic_efficiency,
            node_nic=lk.node_nic_bytes_per_s * lk.nic_efficiency, nvlink_latency=nvl_lat, nic_latency=nic_lat,
            launch=(lk.launch_us if lk.launch_us is not None else lk.nvlink_latency_us) * 1e-6,
            copy=mem / 2,
            checksum=(lk.checksum_gbytes_per_s * 1e9) if lk.checksum_gbytes_per_s else mem / 4,
            nics_per_node=lk.nics_per_node, peak_nvlink=lk.nvlink_bytes_per_s, peak_nic=lk.nic_bytes_per_s,
            peak_node_nic=lk.node_nic_bytes_per_s, msg_concurrency=1 if site.cpu_only else NCCL_OPS_PER_CHANNEL,
            ops_per_launch=1 << 30 if site.cpu_only else NCCL_OPS_PER_GROUP,
            land_param=lk.landing_us_per_param * 1e-6, loader_call=lk.loader_us_per_tensor * 1e-6,
        )
        probe = checksum_probe if site.cpu_only and checksum_probe and checksum_probe[0] > 0 else None
        source = "datasheet"
        if probe and not lk.checksum_gbytes_per_s:
            kw["checksum"] = probe[0]
            source = f"datasheet; checksum {probe[1]}"
        if site.cpu_only:
            n = max(1, cores or 1)
            kw.update(host=lk.node_nic_bytes_per_s, peak_host=lk.node_nic_bytes_per_s,
                      broadcast=lk.node_nic_bytes_per_s, cores=n, copy_all=kw["copy"] * n, checksum_all=kw["checksum"] * n)
        if measured is None:
            return cls(**kw, source=source)
        m = measured.figures
        kw.update(
            nvlink=m["intra_node_bytes_per_s"], nic=m["cross_node_bytes_per_s"],
            node_nic=max(m["node_aggregate_bytes_per_s"], m["cross_node_bytes_per_s"]),
            nvlink_latency=m["intra_node_latency_s"], nic_latency=m["cross_node_latency_s"],
            launch=m["launch_s"], copy=m["copy_bytes_per_s"], checksum=m["checksum_bytes_per_s"],
            land_param=m.get("landing_s_per_param", kw["land_param"]),
            loader_call=m.get("loader_s_per_tensor", kw["loader_call"]),
            mapping_entry=m.get("mapping_s_per_entry", MAPPING_ENTRY_S),
            named_param=m.get("named_params_s_per_param", NAMED_PARAM_S),
        )
        # a measured rate can beat a datasheet figure; the lower bound takes the higher of the two
        kw.update(peak_nvlink=max(kw["peak_nvlink"], kw["nvlink"]), peak_nic=max(kw["peak_nic"], kw["nic"]),
                  peak_node_nic=max(kw["peak_node_nic"], kw["node_nic"]))
        if site.cpu_only:
            agg = m["node_aggregate_bytes_per_s"]
            kw.update(host=agg, peak_host=agg, broadcast=m["broadcast_bytes_per_s"], cores=max(1, measured.cores),
                      nvlink_latency=m["per_message_s"], nic_latency=m["per_message_s"],
                      copy_all=m["copy_side_bytes_per_s"], checksum_all=m["checksum_side_bytes_per_s"],
                      checksum_world=m.get("checksum_world_bytes_per_s"), control=m.get("control_round_s"))
        source = f"calibration {measured.path} ({measured.date})"
        stale = (getattr(measured, "versions", None) or {}).get("checksum_path")
        if probe and stale and stale != probe[1].split(" ")[0]:
            n = kw["cores"]
            kw.update(checksum=probe[0], checksum_all=probe[0] * n, checksum_world=None)
            source += f"; checksum {probe[1]} (the calibration measured {stale})"
        return cls(**kw, source=source)


@dataclass(frozen=True)
class Prediction:
    transport: str
    predicted_s: float
    bytes_moved: int  # bytes on the wire (relayed and broadcast bytes counted per hop/receiver)
    busiest_rank: int
    busiest_link: str  # of the step with the longest wire time: "nic_send" | ... | "broadcast" | "gather"
    busiest_link_bytes: int
    num_steps: int  # rounds + buckets
    breakdown: dict = field(default_factory=dict)  # term -> seconds on the critical path (sums to predicted_s)
    landing: dict = field(default_factory=dict)  # the landing term's counts, and what a loader path would take
    # the breakdown split by the refit's measured phases (runs/summary.py): ``verify`` = the checksums taken
    # after the last round and the closing collectives, ``commit`` = landing, ``transfer`` = the rest
    phases: dict = field(default_factory=dict)


def _shared(per_rank_max: np.ndarray, total: np.ndarray, rate: float, together: float | None) -> np.ndarray:
    """Seconds of a copy or checksum term: the busiest rank's bytes at one rank's ``rate``; on cpu_only
    sites at least all working ranks' bytes at the rate the working ranks reach ``together`` (sharing
    cores and memory: one side's in the transfer phases, where senders pack and receivers unpack; both
    sides' in the verify phase)."""
    t = per_rank_max / rate
    if together:
        t = np.maximum(t, total / together)
    return t


def _round_terms(rounds: np.ndarray, node_of: np.ndarray, num_nodes: int, links: Links):
    """Per round [R] wire, latency, pack seconds and the busiest (rank, link, bytes) of each round."""
    R = rounds.shape[0]
    onehot = np.zeros((rounds.shape[2], num_nodes))
    onehot[np.arange(rounds.shape[2]), node_of] = 1.0
    cands = [("nic_send", rounds[:, NIC_SEND], links.nic), ("nic_recv", rounds[:, NIC_RECV], links.nic),
             ("nvlink_send", rounds[:, NVL_SEND], links.nvlink), ("nvlink_recv", rounds[:, NVL_RECV], links.nvlink),
             ("node_nic_send", rounds[:, NIC_SEND] @ onehot, links.node_nic),
             ("node_nic_recv", rounds[:, NIC_RECV] @ onehot, links.node_nic)]
    if links.host:
        total = (rounds[:, NIC_SEND] + rounds[:, NVL_SEND]).sum(axis=1, keepdims=True)
        cands.append(("host_copy", total, links.host))
    times = np.stack([v.max(axis=1) / bw for _, v, bw in cands])  # [C, R]
    which = times.argmax(axis=0)
    wire = times.max(axis=0)
    busiest = []
    for r in range(R):
        name, v, _ = cands[which[r]]
        j = int(v[r].argmax())
        rank = j if name in ("nic_send", "nic_recv", "nvlink_send", "nvlink_recv") else \
            (int(np.nonzero(node_of == j)[0][0]) if name.startswith("node") else
             int((rounds[r, NIC_SEND] + rounds[r, NVL_SEND]).argmax()))
        busiest.append((rank, name, float(v[r, j])))
    msgs = rounds[:, MSGS]
    per_msg = np.where(rounds[:, NIC_SEND].sum(axis=1) > 0, max(links.nic_latency, links.nvlink_latency),
                       links.nvlink_latency)
    busy = np.ceil(msgs.max(axis=1) / links.msg_concurrency)
    if links.cores:
        busy = np.maximum(busy, msgs.sum(axis=1) / 2 / links.cores)  # each message is posted on both ends
    launches = np.ceil(msgs.max(axis=1) / links.ops_per_launch)
    latency = np.where(msgs.max(axis=1) > 0, links.launch * launches + busy * per_msg, 0.0)
    pack = _shared(rounds[:, PACK_SEND].max(axis=1), rounds[:, PACK_SEND].sum(axis=1), links.copy, links.copy_all) + \
        _shared(rounds[:, PACK_RECV].max(axis=1), rounds[:, PACK_RECV].sum(axis=1), links.copy, links.copy_all)
    staged = rounds[:, PACK_SEND]  # a sender sums a staging block before posting it (in place: later)
    cksum = _shared(staged.max(axis=1), staged.sum(axis=1), links.checksum, links.checksum_all)
    return wire, latency, pack, cksum, busiest


def _verify_checksums(links: Links, stats: PlanStats | None = None, bs: BucketStats | None = None) -> float:
    """The checksums of bytes sent or received in place, all at once: on GPUs what the ranks defer to
    the verify phase (``ChecksumExchange.settle_all``); on the CPU taken during the steps, in the
    transfer phase (``predict``). Rounds: receivers checksum what landed in their
    weights, senders what they sent in place (read from their arena, never staged). Buckets: every
    gather sender what it sent in place from its arena (the root sums what it gathered, and members
    what they hold, during the transfer). Where both sides have work there, the rate of every rank
    together (``checksum_world``) bounds the total."""
    got = in_place = 0.0
    if stats is not None:
        sent = stats.per_rank[NIC_SEND] + stats.per_rank[NVL_SEND]
        in_place = np.maximum(sent - stats.per_rank[PACK_SEND], 0.0)
        got = stats.per_rank[NIC_RECV] + stats.per_rank[NVL_RECV]
    if bs is not None:
        in_place = in_place + bs.gather_sent
    work = np.asarray(got + in_place, dtype=np.float64).reshape(-1)
    if not work.size:
        return 0.0
    both = np.sum(got) > 0 and np.sum(in_place) > 0
    together = links.checksum_world if both and links.checksum_world else links.checksum_all
    return float(_shared(np.asarray([work.max()]), np.asarray([work.sum()]), links.checksum, together)[0])


def _bucket_terms(bs: BucketStats, links: Links):
    """Per bucket [B]: (gather, broadcast, unpack) phases, each a [5, B] array of the TERMS."""
    B = bs.nbytes.size
    z = np.zeros(B)
    g_wire = np.max(np.stack([bs.root_nic_recv / links.nic, bs.root_nvl_recv / links.nvlink,
                              bs.send_nic_max / links.nic, bs.send_nvl_max / links.nvlink,
                              bs.node_send_max / links.node_nic, bs.root_nic_recv / links.node_nic]), axis=0)
    if links.host:
        g_wire = np.maximum(g_wire, bs.gather_send_total / links.host)
    per_msg = max(links.nic_latency, links.nvlink_latency)
    g_msgs = np.ceil(bs.root_msgs / links.msg_concurrency)
    g_lat = np.where(bs.root_msgs > 0, links.launch + g_msgs * per_msg, 0.0)
    g_pack = _shared(bs.root_copy, bs.root_copy, links.copy, links.copy_all)  # senders send in place
    # the root checksums the bucket (its trailer) and every gathered piece; senders sum their pieces
    # later, in the verify phase (they sent them in place: ``_verify_checksums``)
    g_ck = _shared(bs.nbytes + bs.gather_send_total, bs.nbytes + bs.gather_send_total, links.checksum,
                   links.checksum_all)
    gather = np.stack([g_wire, g_lat, g_pack, g_ck, z])
    recv = np.asarray([r.receivers for r in bs.rings], dtype=np.float64)[bs.ring_of] if B else z
    if links.broadcast:  # cpu_only: the measured delivered rate (every receiver's copy through the host)
        b_wire = bs.nbytes * recv / links.broadcast
    else:
        ring_bw = []
        for r in bs.rings:
            bw = links.nvlink if r.intra_hops else math.inf
            if r.net_hops:
                bw = min(bw, min(r.min_rails, links.nics_per_node) * links.nic, links.node_nic)
            ring_bw.append(bw if bw < math.inf else links.nvlink)
        b_wire = bs.nbytes / np.asarray(ring_bw)[bs.ring_of] if B else z
    hop_lat = np.asarray([links.launch + r.intra_hops * links.nvlink_latency + r.net_hops * links.nic_latency
                          for r in bs.rings])[bs.ring_of] if B else z
    if links.cores:
        hop_lat = np.maximum(hop_lat, links.launch + recv * per_msg)
    bcast = np.stack([b_wire, hop_lat, z, z, z])
    u_pack = _shared(bs.held_slice_max, bs.held_slice_total, links.copy, links.copy_all)
    u_ck = _shared(bs.held_full_max, bs.held_full_total, links.checksum, links.checksum_all)
    unpack = np.stack([z, z, u_pack, u_ck, z])
    return gather, bcast, unpack


def _sync(plan: Plan, links: Links) -> float:
    """The checksum exchange (one small message per peer, one grouped operation), the all-rank vote and
    the acknowledgement (tree all-reduces, runtime/groups.py): a measured control round each where
    calibrated (``control``: on shared cores a round waits for processes to be scheduled, more than the
    wire latency); else one step for the exchange and ``2 ceil(log2 world)`` steps per all-reduce, each
    one operation and one latency."""
    if links.control:
        return 3 * links.control
    lat = max(links.nic_latency, links.nvlink_latency)
    steps = 1 + 2 * 2 * math.ceil(math.log2(max(2, plan.world)))
    return steps * (links.launch + lat)


def landing_seconds(views, tensors, nbytes, links: Links):
    """One inference rank's landing (seconds, per rank where arrays are given): direct (its segments x
    ``land_param`` + bytes / ``copy``) and through a framework loader (its HF tensors x ``loader_call`` +
    the same bytes / ``copy``). Linear in every count: zero for a rank that holds nothing, additive over
    disjoint sets of parameters."""
    copy_s = np.asarray(nbytes, dtype=np.float64) / links.copy
    return (np.asarray(views, dtype=np.float64) * links.land_param + copy_s,
            np.asarray(tensors, dtype=np.float64) * links.loader_call + copy_s)


def _landing(plan: Plan, links: Links) -> dict:
    """The landing term: the busiest inference rank's direct landing (every rank lands at once after the
    commit; on ``cpu_only`` sites at least all ranks' host work over the cores and all bytes at ``copy_all``)
    and, for the same counts, the loader path's seconds and what it adds."""
    c = landing_counts(plan)
    if not c.views.size:
        return {"seconds": 0.0, "infer_rank": 0, "params": 0, "tensors": 0, "bytes": 0,
                "per_param_s": links.land_param, "per_tensor_loader_s": links.loader_call,
                "loader_s": 0.0, "loader_extra_s": 0.0}
    direct, loader = landing_seconds(c.views, c.tensors, c.nbytes, links)
    r = int(direct.argmax())
    direct_s, loader_s = float(direct.max()), float(loader.max())
    if links.cores:
        copy_all = float(c.nbytes.sum()) / (links.copy_all or links.copy * links.cores)
        direct_s = max(direct_s, float(c.views.sum()) * links.land_param / links.cores + copy_all)
        loader_s = max(loader_s, float(c.tensors.sum()) * links.loader_call / links.cores + copy_all)
    return {"seconds": direct_s, "infer_rank": r, "params": int(c.views[r]), "tensors": int(c.tensors[r]),
            "bytes": int(c.nbytes[r]), "per_param_s": links.land_param, "per_tensor_loader_s": links.loader_call,
            "loader_s": loader_s, "loader_extra_s": loader_s - direct_s}


def predict(plan: Plan, links: Links, stats: PlanStats | None = None, bstats: BucketStats | None = None, *,
            land: bool = True) -> Prediction:
    """The refit's predicted seconds by term. ``land=False``: the ranks commit without landing in framework
    parameters (``reshardctl run``'s own ranks swap their arena at the commit): the ``landing`` term is 0,
    ``Prediction.landing`` still says what landing would cost."""
    topo = plan.topology
    num_nodes = int(topo.node_of.max()) + 1
    overlap = not links.cores  # GPU sites: the executor overlaps copies with transfers
    total = np.zeros(len(STEP_TERMS))
    busiest = (0, "none", 0.0, 0.0)  # rank, link, bytes, seconds of the slowest step's wire
    moved = 0
    verify_ck = 0.0
    if plan.rounds:
        stats = stats or p2p_stats(plan)
        moved += stats.bytes_total
        wire, lat, pack, ck, busy = _round_terms(stats.rounds, topo.node_of, num_nodes, links)
        r = int(wire.argmax())
        busiest = (*busy[r], float(wire[r]))
        transfer = np.stack([wire, lat, np.zeros_like(wire), np.zeros_like(wire), np.zeros_like(wire)])
        copies = np.stack([np.zeros_like(wire), np.zeros_like(wire), pack, ck, np.zeros_like(wire)])
        if overlap:  # a round costs the larger of its transfer and its copies (packing the next one)
            pick = transfer.sum(axis=0) >= copies.sum(axis=0)
            total += np.where(pick, transfer, copies).sum(axis=1)
        else:
            total += transfer.sum(axis=1) + copies.sum(axis=1)
    if plan.buckets:
        bs = bstats or bucket_stats(plan)
        moved += int(bs.link_bytes.sum())
        gather, bcast, unpack = _bucket_terms(bs, links)
        if overlap:  # gather k+1 and unpack k-1 run while bucket k is broadcast
            B = bs.nbytes.size
            phases = np.stack([bcast, np.concatenate([gather[:, 1:], np.zeros((5, 1))], axis=1),
                               np.concatenate([np.zeros((5, 1)), unpack[:, :-1]], axis=1)])  # [3, 5, B]
            pick = phases.sum(axis=1).argmax(axis=0)
            total += phases[pick, :, np.arange(B)].sum(axis=0) + gather[:, 0] + unpack[:, -1]
        else:
            total += gather.sum(axis=1) + bcast.sum(axis=1) + unpack.sum(axis=1)
        for phase, name in ((bcast, "broadcast"), (gather, "gather")):
            k = int(phase[0].argmax())
            if phase[0, k] > busiest[3]:
                nb = bs.nbytes[k] if name == "broadcast" else bs.root_nic_recv[k] + bs.root_nvl_recv[k]
                busiest = (plan.buckets[k].root, name, float(nb), float(phase[0, k]))
    if plan.rounds or plan.buckets:
        verify_ck = _verify_checksums(links, stats if plan.rounds else None, bs if plan.buckets else None)
        total[TERMS.index("checksum")] += verify_ck
    sync = _sync(plan, links)
    total[TERMS.index("sync")] += sync
    landing = _landing(plan, links)  # after the commit: on the critical path, alone
    land_s = landing["seconds"] if land else 0.0
    breakdown = {t: float(v) for t, v in zip(STEP_TERMS, total)} | {"landing": land_s}
    # on the CPU (cpu_only sites) the executor takes these checksums as the steps go, each message's as
    # it lands and the in-place sends' right after their post (runtime/executor.py): in the transfer
    # phase, added (the ranks share the cores); on GPUs they wait for the verify phase
    # of the three closing collectives, the checksum exchange and the vote are in the verify phase, the
    # acknowledgement in the commit phase (runtime/refit.py)
    verify = {"checksum": 0.0 if links.cores else float(verify_ck), "sync": float(sync) * 2 / 3}
    commit = {"sync": float(sync) / 3, "landing": land_s}
    phases = {"transfer": {t: breakdown[t] - verify.get(t, 0.0) - (commit["sync"] if t == "sync" else 0.0)
                           for t in STEP_TERMS}, "verify": verify, "commit": commit}
    return Prediction(plan.transport, float(total.sum()) + land_s, int(moved), busiest[0], busiest[1], int(busiest[2]),
                      len(plan.rounds) + len(plan.buckets), breakdown, landing, phases)
