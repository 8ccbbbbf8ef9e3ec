"""The plan report: per-transport figures (the ``--json`` object of ``reshardctl plan``), what-if ranking."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from reshardctl.request.resolve import Inputs
from reshardctl.plan.refit_plan import Plan
from reshardctl.topology import side_of_global

LINK_CLASSES = ("intra_node", "intra_domain", "cross_domain")


def transport_report(plan: Plan, links, lb, stats=None) -> dict:
    """One transport's row (the ``transports.<name>`` object of ``--json``); ``stats``: the plan's
    ``p2p_stats`` where the caller has them."""
    from reshardctl.plan.bucket_stats import bucket_stats
    from reshardctl.plan.cost import predict
    from reshardctl.plan.stats import p2p_stats

    if stats is None and plan.rounds:
        stats = p2p_stats(plan)
    bstats = bucket_stats(plan) if plan.buckets else None
    pred = predict(plan, links, stats, bstats)
    by_link = np.zeros(3, dtype=np.int64)
    if stats is not None:
        by_link += np.asarray([stats.bytes_by_link[k] for k in LINK_CLASSES], dtype=np.int64)
    if bstats is not None:
        by_link += bstats.link_bytes.astype(np.int64)
    transfers = plan.num_transfers + sum(
        sum(len(pr.regions) for pr in b.gather if pr.peer != b.root) + len(b.group) - 1 for b in plan.buckets)
    staging = max([stats.max_staging if stats else 0] + [b.nbytes for b in plan.buckets])
    side, side_rank = side_of_global(pred.busiest_rank, plan.train_world)
    return {
        "predicted_s": pred.predicted_s,
        "predicted_breakdown_s": pred.breakdown,
        "landing": pred.landing,
        "efficiency": (lb.seconds / pred.predicted_s) if pred.predicted_s > 0 else 1.0,
        "bytes_moved": int(pred.bytes_moved),
        "transfers": int(transfers),
        "p2p_transfers": int(plan.num_transfers),
        "rounds": len(plan.rounds),
        "buckets": len(plan.buckets),
        "max_staging_bytes": int(staging),
        "busiest": {"rank": int(pred.busiest_rank), "side": side, "side_rank": int(side_rank),
                    "link": pred.busiest_link, "bytes": int(pred.busiest_link_bytes)},
        "fingerprint": plan.fingerprint,
        "relay": bool(plan.relay),
        "bucket_bytes": int(plan.bucket_bytes),
        "bytes_by_link": {k: int(v) for k, v in zip(LINK_CLASSES, by_link)},
        "planning_s": plan.planning_s,
    }


def infer_needed_bytes(model, infer) -> int:
    """Bytes all inference ranks together must end up holding (replicas counted per rank)."""
    classes, reps = infer.placement_classes()
    per_template: dict[int, int] = {}
    numel = np.empty(len(reps), dtype=np.int64)  # per placement class: elements over all its slots
    for c, p in enumerate(reps):
        tpl = p.template
        n = per_template.get(id(tpl))
        if n is None:
            n = per_template[id(tpl)] = int(tpl.slot_numels().sum())
        numel[c] = n
    return int((numel[classes] * model.itemsizes).sum()) if len(classes) else 0


# the parts of a report by their rough cost: workers take them heaviest first (DeepSeek-V3 256+256 on 2 cores,
# relay on: reshard 0.50 s, hybrid 0.39, gather_broadcast 0.19, m2n 0.075, framework 0.035: one worker
# reshard then m2n, the other hybrid, gather_broadcast, framework)
PART_WEIGHT = {"reshard": 6.0, "hybrid": 4.0, "gather_broadcast": 3.0, "m2n": 1.0, "framework": 0.5}
STAGE_TEXT = {"framework": "NeMo RL's own refit", "m2n": "m2n compatibility"}


def plan_report(inp: Inputs, progress: Callable[[str, int, int], None] | None = None, *,
                keep_plans: bool = True) -> tuple[dict[str, Plan], dict]:
    """Plan every requested transport (+ candidates); return the plans and the ``--json`` object.

    ``keep_plans=False`` (``plan`` without ``--out`` or ``--export-transfers``: nothing reads the plans
    themselves): the transports are planned and costed side by side in forked workers, with the
    ``--compare-infer`` candidates (``fork_map``: each worker takes the next job when it is free, the
    candidates first, then the parts heaviest first), only their figures come back, and the plans returned
    are none; the object is the same either way. ``progress(what, done, total)``, if given, is told each
    stage as it begins (each transport's plan and figures, NeMo RL's refit, the candidates; with workers:
    one stage for all the parts and candidates): it only listens; the plans and the object are the same."""
    from reshardctl.fork_map import fork_map, workers_available

    t0 = time.perf_counter()
    order = (inp.primary,) + tuple(t for t in inp.transports if t != inp.primary) if inp.primary in inp.transports else inp.transports
    # the m2n verdicts: from the reshard part's units where it plans them unrelayed, else a part of their own
    parts = list(order) + ["framework"] + ([] if _reshard_gives_m2n(inp) else ["m2n"])
    total = len(parts) + bool(inp.compare)
    done = 0

    def stage(what: str, steps: int = 1) -> None:
        nonlocal done
        if progress is not None:
            progress(what, done, total)
        done += steps

    todo = _candidates_to_plan(inp)
    workers = 1 if keep_plans else min(workers_available(), len(parts) + len(todo))
    candidate_figures = None
    if workers > 1:
        inp.train.placement_classes()  # once, before the fork: every part reads them
        inp.infer.placement_classes()
        also = f" and {len(todo)} candidate layout(s)" if todo else ""
        stage(f"planning and costing {', '.join(order)}{also} in {workers} processes", len(parts))
        jobs = [("candidate", c) for c in todo.values()] + \
            [("part", x) for x in sorted(parts, key=lambda x: -PART_WEIGHT[x])]
        out = fork_map(lambda job: _candidate_figures(inp, order[0], job[1]) if job[0] == "candidate"
                       else _part(inp, job[1], False), jobs, workers)
        candidate_figures = dict(zip(todo, out[:len(todo)]))
        got = {job[1]: r for job, r in zip(jobs[len(todo):], out[len(todo):])}
    else:
        got = {}
        for x in parts:
            stage(STAGE_TEXT.get(x) or f"planning and costing {x}")
            got[x] = _part(inp, x, keep_plans)
    lb = got[order[0]]["lower_bound"]
    compat = next(got[x]["m2n_compat"] for x in parts if "m2n_compat" in got[x])
    first = got[order[0]]["row"]
    result = {
        "fingerprint": first["fingerprint"],
        "primary_transport": order[0],
        "bytes_total": int(inp.model.num_bytes),
        "bytes_needed_by_inference_ranks": infer_needed_bytes(inp.model, inp.infer),
        "lower_bound_s": lb.seconds,
        "lower_bound_reason": lb.reason,
        "cost_figures": inp.links.source,
        "transports": {t: got[t]["row"] for t in order},
        "m2n_compat": compat,
        # NeMo RL's own refit of the same model and layouts, term by term (plan/engine_cost.py), its buffers the
        # plan's bucket bound (NeMo RL's default is 0.02 x GPU memory, capped at 5 GiB): the collective path, and
        # nccl_reshard where the hybrid plan (its bulk / misc split) was planned
        "framework_refit": {"collective": got["framework"]["collective"]}
        | ({"nccl_reshard": got["hybrid"]["nccl_reshard"]} if "hybrid" in got else {}),
        "planning_s": 0.0,
        "inputs": inputs_json(inp),
    }
    if inp.compare:
        stage(f"ranking {len(inp.compare)} inference layouts")
        result["compare"] = compare(inp, order[0], (first, lb), candidate_figures)
    result["planning_s"] = time.perf_counter() - t0
    return {t: got[t]["plan"] for t in order if "plan" in got[t]}, result


def _reshard_gives_m2n(inp: Inputs) -> bool:
    """The m2n verdicts need the unrelayed reshard units: the reshard part's own where it plans them."""
    return "reshard" in inp.transports and not inp.relay


def _part(inp: Inputs, name: str, keep_plan: bool) -> dict:
    """One part of the report: a transport's plan reduced to its row and lower bound (the reshard plan's
    units also give the m2n verdicts, the hybrid plan NeMo RL's nccl_reshard refit), ``framework``:
    NeMo RL's collective refit, or ``m2n``: the m2n verdicts where no reshard part gives its units."""
    from reshardctl.plan.engine_cost import framework_refit, nccl_reshard_refit
    from reshardctl.plan.gpu_memory import gpu_memory
    from reshardctl.plan.lower_bound import lower_bound
    from reshardctl.plan.m2n_compat import m2n_compat
    from reshardctl.plan.planner import build_plan
    from reshardctl.plan.stats import p2p_stats

    if name == "framework":
        return {"collective": framework_refit(inp.model, inp.train, inp.infer, inp.topology, inp.links,
                                              buffer_bytes=inp.bucket_bytes)}
    if name == "m2n":
        return {"m2n_compat": m2n_compat(inp.model, inp.train, inp.infer, inp.topology)}
    plan = build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=name,
                      bucket_bytes=inp.bucket_bytes, relay=inp.relay, broadcast_span=inp.broadcast_span)
    stats = p2p_stats(plan) if plan.rounds else None
    lb = lower_bound(plan, inp.links)  # transport-independent: every part's is the same
    out = {"row": transport_report(plan, inp.links, lb, stats), "lower_bound": lb}
    # per GPU: the busiest ranks' weights, staged copy, pool and NCCL buffers (none on cpu_only sites)
    out["row"]["gpu_memory"] = None if inp.site.cpu_only else gpu_memory(plan, inp.site.nccl, inp.site.gpu_memory_bytes)
    if name == "reshard" and _reshard_gives_m2n(inp):
        out["m2n_compat"] = m2n_compat(inp.model, inp.train, inp.infer, inp.topology, units=plan.units)
    if name == "hybrid":
        out["nccl_reshard"] = nccl_reshard_refit(plan, inp.links, buffer_bytes=inp.bucket_bytes, stats=stats)
    if keep_plan:
        out["plan"] = plan
    return out


def _is_current(inp: Inputs, c) -> bool:
    return c.layout is inp.infer and c.topology is inp.topology


def _candidates_to_plan(inp: Inputs) -> dict[str, object]:
    """The candidates ``compare`` plans: spec -> its first candidate, in candidate order, leaving out the
    current layout's spec (its row is the report's) and repeats of an earlier spec."""
    current = {c.spec for c in inp.compare if _is_current(inp, c)}
    todo: dict[str, object] = {}
    for c in inp.compare:
        if c.spec not in current:
            todo.setdefault(c.spec, c)
    return todo


def compare(inp: Inputs, transport: str, current: tuple[dict, object], figures: dict[str, dict] | None = None) -> list[dict]:
    """Rank the candidate inference layouts. ``current``: the report row of ``transport``'s plan for the
    current layout and its lower bound, already computed (the current candidate reuses them); a candidate
    repeating the spec of an earlier one (``--compare-infer`` naming the current layout) reuses its row.
    ``figures``: the other candidates' figures (``_candidates_to_plan``) where the caller planned them
    already (``plan_report``'s workers); else they are planned here side by side in forked workers
    (``fork_map``: one per CPU this process may use, ``$RESHARDCTL_PLAN_WORKERS`` to set). The rows are the
    same either way."""
    from reshardctl.fork_map import fork_map

    report, lb = current
    mine = {"predicted_s": report["predicted_s"], "lower_bound_s": lb.seconds, "bytes_moved": report["bytes_moved"],
            "fingerprint": report["fingerprint"], **_memory_figures(report.get("gpu_memory"))}
    todo = _candidates_to_plan(inp)
    if figures is None:
        figures = dict(zip(todo, fork_map(lambda c: _candidate_figures(inp, transport, c), list(todo.values()))))
    rows = []
    for c in inp.compare:
        f = figures[c.spec] if c.spec in todo else mine
        pred_s, lb_s = f["predicted_s"], f["lower_bound_s"]
        rows.append({
            "infer": c.spec, "layout": c.layout.describe(), "current": c.current,
            "infer_world": c.layout.world_size, "transport": transport, "predicted_s": pred_s,
            "lower_bound_s": lb_s,
            "efficiency": lb_s / pred_s if pred_s > 0 else 1.0,
            "bytes_moved": f["bytes_moved"], "fingerprint": f["fingerprint"],
            "gpu_memory_bytes": f["gpu_memory_bytes"], "fits": f["fits"],
        })
    rows.sort(key=lambda r: (r["predicted_s"], r["infer"]))
    for k, r in enumerate(rows, 1):
        r["rank"] = k
    return rows


def _candidate_figures(inp: Inputs, transport: str, c) -> dict:
    """One candidate inference layout's plan of ``transport``, reduced to its row's figures."""
    from reshardctl.plan.cost import predict
    from reshardctl.plan.gpu_memory import gpu_memory
    from reshardctl.plan.lower_bound import lower_bound
    from reshardctl.plan.planner import build_plan

    p = build_plan(inp.model, inp.train, c.layout, c.topology, transport=transport,
                   bucket_bytes=inp.bucket_bytes, relay=inp.relay, broadcast_span=inp.broadcast_span)
    pred = predict(p, inp.links)
    mem = None if inp.site.cpu_only else gpu_memory(p, inp.site.nccl, inp.site.gpu_memory_bytes)
    return {"predicted_s": pred.predicted_s, "lower_bound_s": lower_bound(p, inp.links).seconds,
            "bytes_moved": int(pred.bytes_moved), "fingerprint": p.fingerprint, **_memory_figures(mem)}


def _memory_figures(mem: dict | None) -> dict:
    """A compare row's GPU memory: the busiest inference rank's total and whether it fits (None: not checked)."""
    return {"gpu_memory_bytes": None if mem is None else mem["inference"]["total_bytes"],
            "fits": None if mem is None else mem["fits"]}


def inputs_json(inp: Inputs) -> dict:
    s, m = inp.site, inp.model
    return {
        "site": s.name,
        "site_source": s.source,
        "model": m.name,
        "model_source": m.source,
        "layers": inp.layers,
        "num_tensors": len(m.tensors),
        "train": inp.train.describe(),
        "infer": inp.infer.describe(),
        "train_style": inp.train_style,
        "infer_style": inp.infer_style,
        "topology": inp.topology.describe(),
        "transports": list(inp.transports),
        "bucket_bytes": inp.bucket_bytes,
        "relay": inp.relay,
        "relay_mode": inp.relay_mode,
        "relay_reason": inp.relay_reason,
        "broadcast_span": inp.broadcast_span,
    }
