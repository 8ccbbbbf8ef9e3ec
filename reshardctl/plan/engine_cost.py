"""NeMo RL's own non-colocated refit, term by term (docs/cost-model.md, "The framework's own refit").

What a refit pays when NeMo RL runs it (``refit_transport`` unset, trainer and generation on separate GPUs),
per tensor and per bucket, beyond what reshardctl's transports pay: the trainer exports every HF tensor
whole through Megatron-Bridge (a pipeline broadcast, a tensor-parallel and an expert-parallel all-gather
per tensor), packs tensors into buffers and broadcasts each from trainer rank 0 to every rank; each vLLM
rank unpacks a buffer and hands it to ``model.load_weights``, which builds its parameter table and expert
mapping per call, maps every name and calls a ``weight_loader`` (narrow, then one copy) per tensor it holds.
Each term's code path (file:line) is in ``SOURCES``; its per-unit figures are ``Links``' (datasheet
bandwidths and latencies, and the host costs ``reshardctl calibrate`` measures: ``loader_call``,
``mapping_entry``, ``named_param``). Nothing is fitted to anyone's refit times.

Pure: the model, both layouts, the topology and the figures in; a dict out (``plan --json``
``framework_refit``). Modelled for a Megatron-Core trainer and a vLLM engine (the layouts NeMo RL's path
runs between); other styles get ``{"skipped": reason}``.
"""

from __future__ import annotations

import math

import numpy as np

from reshardctl.models.architectures import EXPERT_KINDS
from reshardctl.plan.distinct import distinct

PRODUCER = ("export_pp_broadcast", "export_tp_gather", "export_ep_gather", "pack")
CONSUMER = ("load_setup", "name_mapping", "loader_calls")
ENGINE_TERMS = PRODUCER + ("broadcast",) + CONSUMER + ("param_copy",)
NRL = "NVIDIA-NeMo/RL 7ea279a"
BRIDGE = "NVIDIA-NeMo/Megatron-Bridge 067f987 src/megatron/bridge/models/conversion/param_mapping.py"
VLLM = "vLLM 0.33.0"
SOURCES = {
    "export_pp_broadcast": f"{BRIDGE}:346-431 broadcast_from_pp_rank (every tensor, from its stage to all PP ranks; "
                           f"called first by every mapping's megatron_to_hf, e.g. :1029-1054)",
    "export_tp_gather": f"{BRIDGE}:618-632 gather_from_tp_ranks (all_gather over the TP group, then torch.cat)",
    "export_ep_gather": f"{BRIDGE}:727-806 gather_from_ep_ranks (one all_gather over the EP group per local "
                        f"expert: EP HF tensors per collective)",
    "pack": f"{NRL} nemo_rl/utils/packed_tensor.py:90-110 (tensors appended until the buffer passes its target, "
            f"then torch.cat)",
    "broadcast": f"{NRL} nemo_rl/utils/packed_tensor.py:111 group.broadcast(src=0) over every trainer and "
                 f"generation rank (nemo_rl/models/policy/workers/base_policy_worker.py init_collective)",
    "load_setup": f"{VLLM} models/deepseek_v2.py:1627 make_expert_params_mapping (3 x (E+R) entries; "
                  f"layers/fused_moe/routed_experts.py:1147 walks named_parameters), :1642 "
                  f"dict(self.named_parameters()), once per load_weights call = per buffer "
                  f"({NRL} nemo_rl/models/generation/vllm/vllm_backend.py:196-199, :574-591, :760-764); "
                  f"AutoWeightsLoader models: one walk, and routed_experts.py:1004-1008 one mapping per MoE layer",
    "name_mapping": f"{VLLM} models/deepseek_v2.py:1676 stacked_params_mapping scan, :1763-1766 "
                    f"expert_params_mapping scanned entry by entry up to the tensor's expert (the whole list for "
                    f"an expert another rank holds); routed_experts.py:1010-1025 (other MoE models) index by expert",
    "loader_calls": f"{VLLM} weight_loader per held tensor (deepseek_v2.py:1709-1710 stacked, :1786-1793 experts, "
                    f":1824 the rest; narrow + copy_)",
    "param_copy": "the held bytes copied into the parameters (device copies, beside the host work)",
}
STACKED_ENTRIES = {"deepseek_v3": 6}  # deepseek_v2.py:1595-1623: gate/up 2 + indexer 2 + MLA 2 (MHA: 3)
DEFAULT_STACKED = 5  # llama.py / qwen3_moe.py stacked_params_mapping: q, k, v, gate, up
SHARD_POS = {"expert_gate": 1, "expert_down": 2, "expert_up": 3}  # (w1 gate, w2 down, w3 up) per expert


def _group_bw(links, size: int, stride: int, gpus_per_node: int) -> tuple[float, float, int]:
    """(bandwidth, per-step latency, nodes spanned) of a group of ``size`` ranks ``stride`` apart."""
    nodes = max(1, math.ceil(size * stride / max(1, gpus_per_node)))
    if nodes == 1:
        return links.nvlink, links.nvlink_latency, 1
    return links.nic, max(links.nic_latency, links.nvlink_latency), nodes


def _buckets(nbytes: np.ndarray, target: int) -> list[tuple[int, int]]:
    """packed_tensor.py:90-110: tensors in export order, a buffer closed once its bytes pass ``target``."""
    out, start, acc = [], 0, 0
    for i, b in enumerate(nbytes):
        acc += int(b)
        if acc > target:
            out.append((start, i + 1))
            start, acc = i + 1, 0
    if start < len(nbytes):
        out.append((start, len(nbytes)))
    return out


def _tensor_columns(model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per tensor: bytes (float64), whether it is a routed expert's, and its position in vLLM's expert
    mapping's per-expert triple (``SHARD_POS``; 0 elsewhere) plus 3 x its expert."""
    nbytes = model.nbytes_array.astype(np.float64)
    kinds = model.kind_array
    expert = np.isin(kinds, sorted(EXPERT_KINDS))
    pos = np.zeros(len(kinds), dtype=np.int64)
    for kind, k in SHARD_POS.items():
        pos[kinds == kind] = k
    pos[expert] += 3 * model.expert_array[expert]
    return nbytes, expert, pos


def _export_seconds(train, topology, links, keep, columns) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Per tensor, trainer rank 0's (the broadcast source's) export: PP broadcast, TP and EP all-gathers."""
    nbytes, expert, _ = columns
    g = topology.gpus_per_node
    stage = len(train.stage_ranks(0))
    pp_bw, pp_lat = (links.nic, max(links.nic_latency, links.nvlink_latency)) if stage >= g else \
        (links.nvlink, links.nvlink_latency)
    ep = max(1, train.ep)
    # per placement class, the distinct non-empty boxes over the slots: the TP (ETP) split of its tensors
    classes, reps = train.placement_classes()
    k = np.asarray([max(1, len({h for h in p.template.holdings if h})) for p in reps], dtype=np.int64)[classes]
    local = nbytes / k  # the TP (ETP) shard a rank exports
    # rank 0 exports its own EP rank's local experts (one conversion task each): 1 / ep of the expert tensors
    # go through its PP broadcast and TP gather, the EP gather then yields the other ep - 1
    share = np.where(expert, 1 / ep, 1.0) * keep
    pp_s = np.zeros(len(nbytes))
    if train.pp > 1:
        pp_s = share * (links.launch + (train.pp - 1) * pp_lat + local / pp_bw)
    tp_s = np.zeros(len(nbytes))
    for size in distinct(k[k > 1]).values.tolist():
        at = k == size
        bw, lat, _ = _group_bw(links, size, 1, g)
        tp_s[at] = share[at] * (links.launch + (size - 1) * lat + (size - 1) * local[at] / bw)
    ep_s = np.zeros(len(nbytes))
    gathered = expert & keep
    if ep > 1 and gathered.any():  # one collective per ep HF tensors
        stride = train.etp if train.etp else train.tp * train.cp
        bw, lat, nodes = _group_bw(links, ep, stride, g)
        wire = (ep - 1) / ep * local[gathered] / links.nvlink
        if nodes > 1:  # the bytes entering each node, over the NICs its group members use
            rails = min(max(1, ep // nodes), links.nics_per_node) * links.nic
            wire = np.maximum(wire, (nodes - 1) / nodes * local[gathered] / min(rails, links.node_nic))
        ep_s[gathered] = (links.launch + (ep - 1) * lat) / ep + wire
    counts = {"pp_broadcasts": float(share.sum()) if train.pp > 1 else 0.0,
              "tp_gathers": float(share[k > 1].sum()),
              "ep_gathers": float(gathered.sum()) / ep if ep > 1 else 0.0}
    counts = {name: int(round(v)) for name, v in counts.items()}
    return pp_s, tp_s, ep_s, counts


def _load_seconds(model, infer, links, keep, columns) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Per tensor, vLLM rank 0's load_weights: name mapping and loader call host seconds, copied bytes."""
    d = model.dims
    _, expert, pos = columns
    R = int(getattr(infer.spec, "redundant", 0) or 0)
    entries = 3 * (d.num_experts + R) if d.num_experts else 0
    # per placement class (placements are interned), the elements rank 0 holds
    classes, reps = infer.placement_classes()
    numel = np.asarray([sum(math.prod(b - a for a, b in bx) for bx in p.holding(0)) for p in reps],
                       dtype=np.float64)
    has = np.asarray([bool(p.holding(0)) for p in reps], dtype=bool)
    held = has[classes] & keep
    held_bytes = numel[classes] * model.itemsizes * held
    scan = np.full(len(keep), float(STACKED_ENTRIES.get(d.arch, DEFAULT_STACKED)))
    if d.arch == "deepseek_v3":  # the hand-rolled loop; others index the mapping by expert
        scan[expert] += np.where(held[expert], pos[expert], entries)
    scan *= keep
    params = len(infer.param_names(0))
    counts = {"held_tensors": int(held.sum()), "params_on_rank": params, "expert_mapping_entries": entries,
              "mapping_entries_scanned": int(scan.sum())}
    return scan * links.mapping_entry, held * links.loader_call, held_bytes, counts


def framework_refit(model, train, infer, topology, links, *, buffer_bytes: int, buffers: int = 2,
                    tensors=None) -> dict:
    """NeMo RL's collective refit of ``model`` from ``train`` (Megatron) to ``infer`` (vLLM): predicted seconds,
    each term on the critical path (``breakdown_s``, sums to ``predicted_s``), each term's total work
    (``work_s``), the counts and per-unit figures behind them and each term's source. ``buffers``: 2 (NeMo RL's
    default, ``NRL_REFIT_NUM_BUFFERS``: exporting and packing buffer k+1 while k is broadcast and loaded), 1
    (the path before NeMo RL PR 1379: every phase one after the other). ``tensors``: the indices of the
    tensors this path carries (None: all; ``nccl_reshard_refit``: its misc path's)."""
    from reshardctl.layout.megatron import MegatronLayout
    from reshardctl.layout.vllm import VllmLayout

    if not isinstance(train, MegatronLayout) or type(infer) is not VllmLayout:
        return {"skipped": "modelled for a Megatron-Core trainer and a vLLM engine (NeMo RL's Megatron path)"}
    keep = np.ones(len(model.tensors), dtype=bool) if tensors is None else \
        np.isin(np.arange(len(model.tensors)), np.asarray(list(tensors), dtype=np.int64))
    columns = _tensor_columns(model)
    nbytes = columns[0] * keep
    pp_s, tp_s, ep_s, counts = _export_seconds(train, topology, links, keep, columns)
    map_s, call_s, held_b, lcounts = _load_seconds(model, infer, links, keep, columns)
    counts.update(lcounts)
    buckets = _buckets(nbytes, buffer_bytes)
    world = train.world_size + infer.world_size
    nodes = topology.train_nodes + topology.infer_nodes
    ring = links.nvlink if nodes == 1 else min(
        links.nvlink, min(topology.gpus_per_node, links.nics_per_node) * links.nic, links.node_nic)
    hops_s = links.launch + (world - nodes) * links.nvlink_latency + (nodes if nodes > 1 else 0) * links.nic_latency
    d = model.dims
    passes = 2 if d.arch == "deepseek_v3" else 1
    moe_layer = np.where(columns[1], model.layer_array, -1)
    kept = [k for k, (a, b) in enumerate(buckets) if keep[a:b].any()]
    starts = np.asarray([a for a, _ in buckets], dtype=np.int64)  # the buckets partition the tensors in order

    def per_bucket(x: np.ndarray) -> np.ndarray:
        """Sums of ``x`` over each kept bucket's tensors."""
        return np.add.reduceat(x, starts)[kept] if kept else np.zeros(0)

    buckets = [buckets[k] for k in kept]
    B = len(buckets)
    bucket_bytes = per_bucket(nbytes)
    if d.arch == "deepseek_v3":
        maps = np.ones(B)
    else:  # one expert mapping per MoE layer a buffer carries (routed_experts.py:1004-1008)
        maps = np.asarray([len(set(moe_layer[a:b][(moe_layer[a:b] >= 0) & keep[a:b]].tolist())) for a, b in buckets],
                          dtype=np.float64)
    per = {
        "export_pp_broadcast": per_bucket(pp_s), "export_tp_gather": per_bucket(tp_s),
        "export_ep_gather": per_bucket(ep_s), "pack": bucket_bytes / links.copy,
        "broadcast": bucket_bytes / ring + hops_s,
        "load_setup": passes * counts["params_on_rank"] * links.named_param
        + maps * counts["expert_mapping_entries"] * links.mapping_entry,
        "name_mapping": per_bucket(map_s), "loader_calls": per_bucket(call_s),
        "param_copy": per_bucket(held_b) / links.copy,
    }
    prod = sum(per[t] for t in PRODUCER)
    host = sum(per[t] for t in CONSUMER)
    cons = np.maximum(host, per["param_copy"])
    breakdown = dict.fromkeys(ENGINE_TERMS, 0.0)

    def charge(phase: str, k: int) -> None:
        terms = PRODUCER if phase == "prod" else ("broadcast",) if phase == "bcast" else \
            (CONSUMER if host[k] >= per["param_copy"][k] else ("param_copy",))
        for t in terms:
            breakdown[t] += float(per[t][k])

    if B and buffers >= 2:  # packed_tensor.py:78-111 / :198-248: buffer k+1 filled while k is on the wire
        charge("prod", 0)
        for k in range(B):
            nxt = prod[k + 1] if k + 1 < B else 0.0
            phase = max((per["broadcast"][k], "bcast"), (nxt, "prod"), (cons[k], "cons"))[1]
            charge(phase, k + 1 if phase == "prod" else k)
    else:
        for k in range(B):
            for phase in ("prod", "bcast", "cons"):
                charge(phase, k)
    per_unit = {"loader_call_s": links.loader_call, "mapping_entry_s": links.mapping_entry,
                "named_param_s": links.named_param, "copy_bytes_per_s": links.copy, "ring_bytes_per_s": ring,
                "launch_s": links.launch, "nvlink_latency_s": links.nvlink_latency, "nic_latency_s": links.nic_latency}
    return {"path": "nemo_rl_collective", "predicted_s": float(sum(breakdown.values())), "breakdown_s": breakdown,
            "work_s": {t: float(v.sum()) for t, v in per.items()}, "buffer_bytes": int(buffer_bytes),
            "buffers": int(buffers), "buckets": B, "tensors": len(model.tensors), "counts": counts,
            "per_unit": per_unit, "sources": SOURCES}


def nccl_reshard_refit(plan, links, *, buffer_bytes: int, stats=None) -> dict:
    """NeMo RL's ``refit_transport: nccl_reshard`` for a ``hybrid`` plan of the same model and layouts: the bulk
    path first (NCCL M2N reshard of the FFN / expert tensors, ``docs/design-docs/nccl-reshard-refit.md``
    "Execution Flow": xferdtensor per parameter), predicted as the plan's rounds (their wire, latency and pack
    terms: no checksum, no vote), then the misc path ("After the bulk reshard completes, the misc parameters are
    transferred": the conventional packed broadcast and ``load_weights``) for the tensors the plan broadcasts,
    predicted by :func:`framework_refit`. ``{"skipped": reason}`` where that does not apply. ``stats``: the
    plan's ``p2p_stats`` where the caller has them (they depend on its rounds only)."""
    from dataclasses import replace

    from reshardctl.plan.cost import predict

    if plan.transport != "hybrid":
        return {"skipped": f"needs the hybrid plan (got {plan.transport})"}
    misc = sorted({i for b in plan.buckets for i in b.tensors})
    miscr = framework_refit(plan.model, plan.train, plan.infer, plan.topology, links, buffer_bytes=buffer_bytes,
                            tensors=misc)
    if "skipped" in miscr:
        return miscr
    rounds = predict(replace(plan, buckets=()), links, stats, land=False).breakdown if plan.rounds else {}
    bulk = {t: float(rounds.get(t, 0.0)) for t in ("wire", "latency", "pack")}
    return {"path": "nemo_rl_nccl_reshard", "predicted_s": sum(bulk.values()) + miscr["predicted_s"],
            "bulk_s": bulk, "misc": miscr, "misc_tensors": len(misc),
            "source": f"{NRL} docs/design-docs/nccl-reshard-refit.md (Bulk path, Misc path, Execution Flow)"}
