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
            n = per_template[id(tpl)] = sum(tpl.slot_numel(s) for s in range(tpl.num_slots))
        numel[c] = n
    return int((numel[classes] * model.itemsizes).sum()) if len(classes) else 0


def plan_report(inp: Inputs, progress: Callable[[str, int, int], None] | None = None) -> tuple[dict[str, Plan], dict]:
    """Plan every requested transport (+ candidates); return the plans and the ``--json`` object.
    ``progress(what, done, total)``, if given, is told each stage as it begins (planning a transport, its
    figures, the lower bound, the candidates): it only listens; the plans and the object are the same."""
    from reshardctl.plan.lower_bound import lower_bound
    from reshardctl.plan.engine_cost import framework_refit, nccl_reshard_refit
    from reshardctl.plan.m2n_compat import m2n_compat
    from reshardctl.plan.planner import build_plan
    from reshardctl.plan.stats import p2p_stats

    t0 = time.perf_counter()
    order = (inp.primary,) + tuple(t for t in inp.transports if t != inp.primary) if inp.primary in inp.transports else inp.transports
    total = 2 * len(order) + 1 + bool(inp.compare)
    done = 0

    def stage(what: str) -> None:
        nonlocal done
        if progress is not None:
            progress(what, done, total)
        done += 1

    plans: dict[str, Plan] = {}
    for tname in order:
        stage(f"planning {tname}")
        plans[tname] = build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=tname,
                                  bucket_bytes=inp.bucket_bytes, relay=inp.relay, broadcast_span=inp.broadcast_span)
    first = plans[order[0]]
    stage("lower bound")
    lb = lower_bound(first, inp.links)
    reports, stats = {}, {}
    for t, p in plans.items():
        stage(f"traffic and predicted time of {t}")
        stats[t] = p2p_stats(p) if p.rounds else None
        reports[t] = transport_report(p, inp.links, lb, stats[t])
    reshard_units = plans["reshard"].units if "reshard" in plans and not inp.relay else None
    compat = m2n_compat(inp.model, inp.train, inp.infer, inp.topology, units=reshard_units)
    result = {
        "fingerprint": first.fingerprint,
        "primary_transport": order[0],
        "bytes_total": int(inp.model.num_bytes),
        "bytes_needed_by_inference_ranks": infer_needed_bytes(inp.model, inp.infer),
        "lower_bound_s": lb.seconds,
        "lower_bound_reason": lb.reason,
        "cost_figures": inp.links.source,
        "transports": reports,
        "m2n_compat": compat,
        # NeMo RL's own refit of the same model and layouts, term by term (plan/engine_cost.py), its buffers the
        # plan's bucket bound (NeMo RL's default is 0.02 x GPU memory, capped at 5 GiB): the collective path, and
        # nccl_reshard where the hybrid plan (its bulk / misc split) was planned
        "framework_refit": {"collective": framework_refit(inp.model, inp.train, inp.infer, inp.topology, inp.links,
                                                          buffer_bytes=inp.bucket_bytes)}
        | ({"nccl_reshard": nccl_reshard_refit(plans["hybrid"], inp.links, buffer_bytes=inp.bucket_bytes,
                                                stats=stats["hybrid"])}
           if "hybrid" in plans else {}),
        "planning_s": 0.0,
        "inputs": inputs_json(inp),
    }
    if inp.compare:
        stage(f"ranking {len(inp.compare)} inference layouts")
        result["compare"] = compare(inp, order[0], (first, reports[order[0]], lb))
    result["planning_s"] = time.perf_counter() - t0
    return plans, result


def compare(inp: Inputs, transport: str, current: tuple[Plan, dict, object] | None = None) -> list[dict]:
    """Rank the candidate inference layouts. ``current``: the plan of ``transport`` for the current layout,
    its report row and its lower bound, already computed (the current candidate reuses them); a candidate
    repeating the spec of an earlier one (``--compare-infer`` naming the current layout) reuses its row.
    The other candidates are planned side by side in forked workers (``fork_map``: one per CPU this
    process may use, ``$RESHARDCTL_PLAN_WORKERS`` to set); the rows are the same either way."""
    from reshardctl.fork_map import fork_map

    figures_of: dict[str, dict] = {}
    if current is not None:
        plan, report, lb = current
        for c in inp.compare:
            if c.layout is inp.infer and c.topology is inp.topology:
                figures_of.setdefault(c.spec, {"predicted_s": report["predicted_s"], "lower_bound_s": lb.seconds,
                                               "bytes_moved": report["bytes_moved"], "fingerprint": plan.fingerprint})
    todo: dict[str, object] = {}  # spec -> its first candidate, in candidate order
    for c in inp.compare:
        if c.spec not in figures_of:
            todo.setdefault(c.spec, c)
    figures_of.update(zip(todo, fork_map(lambda c: _candidate_figures(inp, transport, c), list(todo.values()))))
    rows = []
    for c in inp.compare:
        figures = figures_of[c.spec]
        pred_s, lb_s = figures["predicted_s"], figures["lower_bound_s"]
        rows.append({
            "infer": c.spec, "layout": c.layout.describe(), "current": c.current,
            "infer_world": c.layout.world_size, "transport": transport, "predicted_s": pred_s,
            "lower_bound_s": lb_s,
            "efficiency": lb_s / pred_s if pred_s > 0 else 1.0,
            "bytes_moved": figures["bytes_moved"], "fingerprint": figures["fingerprint"],
        })
    rows.sort(key=lambda r: (r["predicted_s"], r["infer"]))
    for k, r in enumerate(rows, 1):
        r["rank"] = k
    return rows


def _candidate_figures(inp: Inputs, transport: str, c) -> dict:
    """One candidate inference layout's plan of ``transport``, reduced to its row's figures."""
    from reshardctl.plan.cost import predict
    from reshardctl.plan.lower_bound import lower_bound
    from reshardctl.plan.planner import build_plan

    p = build_plan(inp.model, inp.train, c.layout, c.topology, transport=transport,
                   bucket_bytes=inp.bucket_bytes, relay=inp.relay, broadcast_span=inp.broadcast_span)
    pred = predict(p, inp.links)
    return {"predicted_s": pred.predicted_s, "lower_bound_s": lower_bound(p, inp.links).seconds,
            "bytes_moved": int(pred.bytes_moved), "fingerprint": p.fingerprint}


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
