"""The planner's entry point: ``build_plan`` (pure: no I/O, no cluster probing)."""

from __future__ import annotations

import hashlib
import time

import numpy as np

from reshardctl.errors import PlanError
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec
from reshardctl.plan.broadcast import build_buckets
from reshardctl.plan.refit_plan import HYBRID_RESHARD_ROLES, TRANSPORTS, Plan
from reshardctl.plan.reshard import build_units, schedule_rounds
from reshardctl.topology import Topology


def build_plan(
    model: ModelSpec,
    train: SideLayout,
    infer: SideLayout,
    topology: Topology,
    *,
    transport: str = "reshard",
    bucket_bytes: int = 256 << 20,
    relay: bool = False,
    broadcast_span: str = "root",
) -> Plan:
    """Compute the transfer plan for one transport. Deterministic: same inputs, same fingerprint.
    ``broadcast_span``: the broadcast groups of gather-and-broadcast buckets (``broadcast.SPANS``)."""
    if transport not in TRANSPORTS:
        raise PlanError(f"unknown transport {transport!r}: choose one of {', '.join(TRANSPORTS)}")
    if bucket_bytes <= 0:
        raise PlanError(f"bucket size must be > 0 bytes (got {bucket_bytes})")
    if train.world_size != topology.train_world or infer.world_size != topology.infer_world:
        raise PlanError(
            f"layouts have {train.world_size} trainer + {infer.world_size} inference ranks, "
            f"the topology {topology.train_world} + {topology.infer_world}"
        )
    t0 = time.perf_counter()
    units, rounds, buckets = [], [], []
    if transport == "reshard":
        units = build_units(model, train, infer, topology, relay=relay)
    elif transport == "hybrid":
        units = build_units(model, train, infer, topology, relay=relay, select=lambda t: t.role in HYBRID_RESHARD_ROLES)
    if units:
        # a p2p transfer cannot be cut below one element: a bucket smaller than an element would
        # silently break the staging bound, so say so
        small = next((u for u in units if u.itemsize > bucket_bytes and len(u.table)), None)
        if small is not None:
            t = model.tensors[int(small.tensors[0])]
            raise PlanError(
                f"bucket size {bucket_bytes} bytes is smaller than one element of {t.name} "
                f"({t.dtype}, {t.itemsize} bytes): p2p rounds cannot stage it",
                hint=f"use a bucket of at least {max(u.itemsize for u in units)} bytes",
            )
        units, rounds, _ = schedule_rounds(units, topology.world, bucket_bytes)
    if transport in ("gather_broadcast", "hybrid"):
        select = None if transport == "gather_broadcast" else (lambda t: t.role not in HYBRID_RESHARD_ROLES)
        buckets = build_buckets(model, train, topology, bucket_bytes, first_index=len(rounds), select=select,
                                span=broadcast_span)
    plan = Plan(
        transport=transport,
        model=model,
        train=train,
        infer=infer,
        topology=topology,
        bucket_bytes=bucket_bytes,
        relay=relay,
        units=tuple(units),
        rounds=tuple(rounds),
        buckets=tuple(buckets),
    )
    object.__setattr__(plan, "fingerprint", fingerprint(plan))
    object.__setattr__(plan, "planning_s", time.perf_counter() - t0)
    plan.__dict__["broadcast_span"] = broadcast_span  # for plan_for (not a field: equality and pickles as before)
    return plan


def plan_for(plan: Plan, transport: str) -> Plan:
    """``plan`` itself when it is for ``transport``, else the plan of ``transport`` rebuilt from the
    plan's own inputs (model, layouts, topology, bucket, relay, broadcast span): what a refitter switches
    to when the site's ledger names another transport. Pure; the same plan ``build_plan`` gives for
    those inputs (the same fingerprint)."""
    if transport == plan.transport:
        return plan
    if not isinstance(plan, Plan):
        raise PlanError(f"a {type(plan).__name__} cannot be re-planned for transport {transport!r}: only a "
                        f"planner Plan carries its model, layouts and topology")
    span = plan.__dict__.get("broadcast_span")
    if span is None:  # a plan built elsewhere: its buckets say whether other trainer ranks join the group
        T = plan.train_world
        span = "stage" if any(sum(r < T for r in b.group) > 1 for b in plan.buckets) else "root"
    return build_plan(plan.model, plan.train, plan.infer, plan.topology, transport=transport,
                      bucket_bytes=plan.bucket_bytes, relay=plan.relay, broadcast_span=span)


def fingerprint(plan: Plan) -> str:
    """sha256 over the inputs (model inventory, layouts, topology, bucket, transport) and the plan."""
    h = hashlib.sha256()

    def put(x) -> None:
        h.update(repr(x).encode())
        h.update(b"\0")

    put((plan.transport, plan.bucket_bytes, plan.relay, plan.model.name))
    h.update(plan.model.inventory_text.encode())
    put((plan.train.describe(), plan.infer.describe(), sorted(plan.topology.describe().items())))
    # the placements themselves: describe() need not determine them (a layout file edited in place
    # keeps its describe(), and load_plan would accept a stale plan for it)
    for layout in (plan.train, plan.infer):
        h.update(_placements_bytes(layout))
    for u in plan.units:  # (an array's buffer: its bytes, not a copy of them)
        h.update(np.ascontiguousarray(u.tensors))
        for arr in (u.table.src, u.table.dst, u.table.stage, u.table.lo, u.table.hi):
            h.update(np.ascontiguousarray(arr))
    # per entry (round index, stage, unit, inst_lo, inst_hi, t_lo, t_hi), row-major
    h.update(_rounds_bytes(plan.rounds))
    h.update(_buckets_bytes(plan.buckets))
    return h.hexdigest()[:16]


def _rounds_bytes(rounds) -> bytes:
    """Every round entry as int64 (round index, stage, *entry), one row per entry, rounds in order."""
    if not rounds:
        return b""
    n = np.fromiter((len(r.entries) for r in rounds), dtype=np.int64, count=len(rounds))
    head = np.stack([np.fromiter((r.index for r in rounds), dtype=np.int64, count=len(rounds)),
                     np.fromiter((r.stage for r in rounds), dtype=np.int64, count=len(rounds))], axis=1)
    return np.concatenate([np.repeat(head, n, axis=0), np.concatenate([r.entries for r in rounds])], axis=1).tobytes()


def _placements_bytes(layout: SideLayout) -> bytes:
    """What the fingerprint hashes of a layout's placements: every distinct (shape, holdings, ranks), in
    first-seen order, then each tensor's content ordinal and stage. Computed once per layout (it is
    immutable; the transports of one command share it)."""
    cached = layout.__dict__.get("_placements_bytes")
    if cached is None:
        classes, reps = layout.placement_classes()
        parts: list[bytes] = []
        by_content: dict[tuple, int] = {}
        ordinal = np.empty(len(reps), dtype=np.int64)  # class -> content ordinal, in first-seen order
        for c, p in enumerate(reps):
            content = (p.template.shape, p.template.holdings, p.ranks)
            k = by_content.get(content)
            if k is None:
                k = by_content[content] = len(by_content)
                parts.append(repr(content).encode() + b"\0")
            ordinal[c] = k
        parts.append(np.stack([ordinal[classes], layout.stage_array()], axis=1).tobytes())
        cached = layout.__dict__["_placements_bytes"] = b"".join(parts)
    return cached


def _buckets_bytes(buckets) -> bytes:
    """Every field of every bucket as one int64 array (lengths first, so the encoding is unambiguous).
    A bucket's group (the root, its stage and every inference rank) is shared by many buckets: encoded
    once per group object and spliced in, not converted from Python ints per bucket; a region's box
    likewise once per box object (whole-tensor boxes and gathered pieces are shared)."""
    groups: dict[int, bytes] = {}  # id(group) -> its bytes; the buckets keep the groups alive
    boxes: dict[int, tuple[int, ...]] = {}  # id(box) -> (ndim, lo0, hi0, ...); the regions keep them alive
    cuts: list[tuple[int, bytes]] = []  # (position in flat, the group's bytes that go there)
    flat = [len(buckets)]
    for b in buckets:
        group = groups.get(id(b.group))
        if group is None:
            group = groups[id(b.group)] = np.asarray(b.group, dtype=np.int64).tobytes()
        flat += (b.index, b.root, b.nbytes, len(b.group))
        cuts.append((len(flat), group))
        flat.append(len(b.tensors))
        flat += b.tensors
        flat.append(len(b.gather))
        for pr in b.gather:
            flat += (pr.peer, len(pr.regions))
            for r in pr.regions:
                box = boxes.get(id(r.box))
                if box is None:
                    box = boxes[id(r.box)] = (len(r.box), *(x for lo_hi in r.box for x in lo_hi))
                flat += (r.tensor, r.nbytes)
                flat += box
    data = np.asarray(flat, dtype=np.int64).tobytes()
    parts: list[bytes] = []
    prev = 0
    for pos, group in cuts:
        parts += (data[prev * 8:pos * 8], group)
        prev = pos
    parts.append(data[prev * 8:])
    return b"".join(parts)
