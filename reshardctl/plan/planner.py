"""The planner's entry point: ``build_plan`` (pure: no I/O, no cluster probing)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

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


_HASH_UNITS = 256  # units (rounds) whose fields the fingerprint takes in one array


def fingerprint(plan: Plan) -> str:
    """sha256 over the inputs (model inventory, layouts, topology, bucket, transport) and the plan. Every
    part has a fixed length (the digests), a count before it (units, rounds, buckets, their fields) or
    ends in a NUL its text cannot contain (``repr`` escapes it), so one byte string is one encoding."""
    h = hashlib.sha256()

    def put(x) -> None:
        h.update(repr(x).encode())
        h.update(b"\0")

    put((plan.transport, plan.bucket_bytes, plan.relay, plan.model.name))
    h.update(_inventory_digest(plan.model))
    put((plan.train.describe(), plan.infer.describe(), sorted(plan.topology.describe().items())))
    # the placements themselves: describe() need not determine them (a layout file edited in place
    # keeps its describe(), and load_plan would accept a stale plan for it)
    for layout in (plan.train, plan.infer):
        h.update(_placements_digest(layout))
    for part in _units_arrays(plan.units):  # (an array's buffer: its bytes, not a copy of them)
        h.update(part)
    for part in _rounds_arrays(plan.rounds):
        h.update(part)
    h.update(_buckets_bytes(plan.buckets))
    return h.hexdigest()[:16]


def _inventory_digest(model: ModelSpec) -> bytes:
    """sha256 of the model's inventory (``name|shape|dtype`` per tensor), computed once per model: the
    plans of one command hash 32 bytes for it, not the 3 MB text (DeepSeek-V3) each."""
    got = model.__dict__.get("_inventory_digest")
    if got is None:
        got = hashlib.sha256(model.inventory_text.encode()).digest()
        object.__setattr__(model, "_inventory_digest", got)  # a frozen dataclass: its caches go this way
    return got


def _units_arrays(units) -> Iterator[np.ndarray]:
    """Every unit's instances and transfer table as int64 arrays: the number of units, per unit
    (instances, rows, box dims), then each field of every unit back to back (boxes flattened row-major),
    in unit order. Each field comes ``_HASH_UNITS`` units at a time: the same bytes in the same order as
    one array per field (what the hash reads), without an array per field of the whole plan."""
    if not units:
        yield np.zeros(1, dtype=np.int64)
        return
    yield np.asarray([len(units)], dtype=np.int64)
    yield np.asarray([(len(u.tensors), len(u.table), u.table.lo.shape[1] if u.table.lo.ndim == 2 else 0)
                      for u in units], dtype=np.int64)
    fields = [lambda u: u.tensors] + [lambda u, f=f: getattr(u.table, f) for f in ("src", "dst", "stage")] + \
        [lambda u, f=f: getattr(u.table, f).reshape(-1) for f in ("lo", "hi")]
    for field in fields:
        for a in range(0, len(units), _HASH_UNITS):
            yield np.concatenate([field(u) for u in units[a:a + _HASH_UNITS]]).astype(np.int64, copy=False)


def _rounds_arrays(rounds) -> Iterator[np.ndarray]:
    """The number of rounds, per round (index, stage, entries), then every round's entries (unit, inst_lo,
    inst_hi, t_lo, t_hi) back to back, rounds in order, as int64 (``_HASH_UNITS`` rounds at a time)."""
    if not rounds:
        yield np.zeros(1, dtype=np.int64)
        return
    yield np.asarray([len(rounds)], dtype=np.int64)
    yield np.asarray([(r.index, r.stage, len(r.entries)) for r in rounds], dtype=np.int64)
    for a in range(0, len(rounds), _HASH_UNITS):
        yield np.concatenate([r.entries for r in rounds[a:a + _HASH_UNITS]]).astype(np.int64, copy=False)


def _placements_digest(layout: SideLayout) -> bytes:
    """sha256 of a layout's placements: every distinct (shape, holdings, ranks), in first-seen order, each
    with its length, then the number of tensors and each one's content ordinal and stage. Computed once
    per layout (it is immutable; the transports of one command share it)."""
    cached = layout.__dict__.get("_placements_digest")
    if cached is None:
        classes, reps = layout.placement_classes()
        h = hashlib.sha256()
        by_content: dict[tuple, int] = {}
        ordinal = np.empty(len(reps), dtype=np.int64)  # class -> content ordinal, in first-seen order
        for c, p in enumerate(reps):
            content = (p.template.shape, p.template.holdings, p.ranks)
            k = by_content.get(content)
            if k is None:
                k = by_content[content] = len(by_content)
                text = repr(content).encode()
                h.update(len(text).to_bytes(8, "little") + text)
            ordinal[c] = k
        h.update(len(classes).to_bytes(8, "little"))
        h.update(np.stack([ordinal[classes], layout.stage_array()], axis=1).tobytes())
        cached = layout.__dict__["_placements_digest"] = h.digest()
    return cached


def _buckets_bytes(buckets) -> bytes:
    """Every field of every bucket as one int64 array (lengths first, so the encoding is unambiguous),
    then the distinct groups. A bucket's group (the root, its stage and every inference rank: hundreds of
    ranks) is shared by many buckets: a bucket gives its group's number, each distinct group is encoded
    once at the end, in first-use order (looked up once per group object); a region's box likewise once per box object (whole-tensor boxes and
    gathered pieces are shared), converted from Python ints once."""
    groups: dict[int, int] = {}  # id(group) -> its number; the buckets keep the groups alive
    numbers: dict[tuple[int, ...], int] = {}  # group -> its number (equal groups, other objects: one number)
    distinct: list[tuple[int, ...]] = []
    boxes: dict[int, tuple[int, ...]] = {}  # id(box) -> (ndim, lo0, hi0, ...); the regions keep them alive
    flat = [len(buckets)]
    for b in buckets:
        g = groups.get(id(b.group))
        if g is None:
            g = groups[id(b.group)] = numbers.setdefault(tuple(b.group), len(distinct))
            if g == len(distinct):
                distinct.append(b.group)
        flat += (b.index, b.root, b.nbytes, g)
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
    flat.append(len(distinct))
    for group in distinct:
        flat.append(len(group))
        flat += group
    return np.asarray(flat, dtype=np.int64).tobytes()
