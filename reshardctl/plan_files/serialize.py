"""A plan on disk: one ``.npz`` file (numpy arrays + one JSON metadata entry; never pickle).

``save_plan(plan, path)`` writes the plan's *content* (units, rounds, broadcast buckets) and a
description of its inputs; ``load_plan(path, model, train, infer, topology)`` rebuilds the ``Plan``
from the file and the re-built inputs and checks that ``planner.fingerprint`` of the result equals
the fingerprint stored in the file. The fingerprint hashes the inputs (model inventory, both layouts'
``describe()`` and placements, the topology, transport, bucket size, relay) and the plan content, so a file loaded
against different inputs (or a damaged file) is a ``PlanError`` naming the file and what differs.

Layout of the archive (docs/plan-format.md has the reference):

* ``meta``: UTF-8 JSON as a ``uint8`` array (format, inputs, fingerprint, dtypes, counts);
* units, concatenated: ``unit_tensors`` (+ ``unit_tensors_off``), ``unit_stage``, ``unit_itemsize``,
  ``unit_ndim``, ``tab_off`` (transfers of unit k are ``tab_*[tab_off[k]:tab_off[k+1]]``),
  ``tab_src``, ``tab_dst``, ``tab_stage``, ``tab_nbytes``, ``tab_lo``/``tab_hi`` (flattened
  ``[n, ndim]`` per unit, offsets ``box_off``);
* rounds: ``round_index``, ``round_stage``, ``round_off`` and ``round_entries`` ``[n, 5]`` int64
  (unit, inst_lo, inst_hi, t_lo, t_hi);
* buckets: ``bucket_hdr`` ``[n, 3]`` (index, root, nbytes), ragged ``bucket_group``,
  ``bucket_tensors``, ``bucket_gather_peer`` (peers per bucket), ``gather_regions_off`` (regions per
  peer), ``region_tensor``, ``region_nbytes``, ``region_ndim``, ``region_box`` (flat lo,hi pairs).
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from reshardctl.atomic_write import atomic_open
from reshardctl.bounded_load import LoadError, loads_json
from reshardctl.errors import PlanError
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec
from reshardctl.plan.refit_plan import Plan, Unit
from reshardctl.plan.rounds import Round, entry_array
from reshardctl.plan.routing import TransferTable
from reshardctl.plan.schedule import BroadcastBucket, PeerRegions, Region
from reshardctl.topology import Topology

FORMAT = "reshardctl-plan/1"
_TABLE_FIELDS = ("src", "dst", "stage", "lo", "hi", "nbytes")


def model_digest(model: ModelSpec) -> str:
    """sha256 (16 hex) of the tensor inventory: (name, shape, dtype) in order."""
    h = hashlib.sha256()
    for t in model.tensors:
        h.update(repr((t.name, tuple(t.shape), t.dtype)).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def describe_inputs(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology) -> dict:
    return {
        "model": model.name,
        "model_source": model.source,
        "model_tensors": len(model.tensors),
        "model_digest": model_digest(model),
        "train": train.describe(),
        "infer": infer.describe(),
        "topology": topology.describe(),
    }


def _ragged(chunks: list[np.ndarray], dtype) -> tuple[np.ndarray, np.ndarray]:
    off = np.zeros(len(chunks) + 1, dtype=np.int64)
    if chunks:
        off[1:] = np.cumsum([c.size for c in chunks])
        flat = np.concatenate([np.asarray(c, dtype=dtype).ravel() for c in chunks])
    else:
        flat = np.zeros(0, dtype=dtype)
    return flat.astype(dtype, copy=False), off


def _field_dtypes(units: tuple[Unit, ...]) -> dict[str, str]:
    """One dtype per table field (and for ``tensors``); a plan mixing dtypes is a bug upstream."""
    out: dict[str, str] = {}
    for u in units:
        for f in _TABLE_FIELDS:
            dt = str(getattr(u.table, f).dtype)
            if out.setdefault(f, dt) != dt:
                raise PlanError(f"cannot serialise: transfer-table field {f} mixes dtypes {out[f]} and {dt}")
        dt = str(u.tensors.dtype)
        if out.setdefault("tensors", dt) != dt:
            raise PlanError(f"cannot serialise: unit tensor indices mix dtypes {out['tensors']} and {dt}")
    defaults = {"src": "int32", "dst": "int32", "stage": "int8", "lo": "int64", "hi": "int64", "nbytes": "int64",
                "tensors": "int32"}
    return {**defaults, **out}


def plan_arrays(plan: Plan) -> dict[str, np.ndarray]:
    """Every array of the archive except ``meta``."""
    dts = _field_dtypes(plan.units)
    a: dict[str, np.ndarray] = {}
    U = plan.units
    a["unit_tensors"], a["unit_tensors_off"] = _ragged([u.tensors for u in U], dts["tensors"])
    a["unit_stage"] = np.asarray([u.stage for u in U], dtype=np.int64)
    a["unit_itemsize"] = np.asarray([u.itemsize for u in U], dtype=np.int64)
    a["unit_ndim"] = np.asarray([u.table.lo.shape[1] if u.table.lo.ndim == 2 else 0 for u in U], dtype=np.int64)
    for f in ("src", "dst", "stage", "nbytes"):
        a[f"tab_{f}"], off = _ragged([getattr(u.table, f) for u in U], dts[f])
    a["tab_off"] = off
    a["tab_lo"], a["box_off"] = _ragged([u.table.lo for u in U], dts["lo"])
    a["tab_hi"], _ = _ragged([u.table.hi for u in U], dts["hi"])

    R = plan.rounds
    a["round_index"] = np.asarray([r.index for r in R], dtype=np.int64)
    a["round_stage"] = np.asarray([r.stage for r in R], dtype=np.int64)
    flat, off = _ragged([r.entries for r in R], np.int64)
    a["round_entries"] = flat.reshape(-1, 5)
    a["round_off"] = off // 5

    B = plan.buckets
    a["bucket_hdr"] = np.asarray([(b.index, b.root, b.nbytes) for b in B], dtype=np.int64).reshape(-1, 3)
    a["bucket_group"], a["bucket_group_off"] = _ragged([np.asarray(b.group, np.int64) for b in B], np.int64)
    a["bucket_tensors"], a["bucket_tensors_off"] = _ragged([np.asarray(b.tensors, np.int64) for b in B], np.int64)
    a["bucket_gather_peer"], a["bucket_gather_off"] = _ragged(
        [np.asarray([g.peer for g in b.gather], np.int64) for b in B], np.int64)
    regions = [reg for b in B for g in b.gather for reg in g.regions]
    per_peer = [len(g.regions) for b in B for g in b.gather]
    a["gather_regions_off"] = np.concatenate([[0], np.cumsum(per_peer, dtype=np.int64)]).astype(np.int64)
    a["region_tensor"] = np.asarray([r.tensor for r in regions], dtype=np.int64)
    a["region_nbytes"] = np.asarray([r.nbytes for r in regions], dtype=np.int64)
    a["region_ndim"] = np.asarray([len(r.box) for r in regions], dtype=np.int64)
    a["region_box"] = np.asarray([x for r in regions for iv in r.box for x in iv], dtype=np.int64)
    return a


def save_plan(plan: Plan, path: str | os.PathLike) -> Path:
    """Write ``plan`` to ``path`` (one ``.npz``), atomically: a temp file in the same directory, then
    ``os.replace``. Returns the path."""
    path = Path(path)
    arrays = plan_arrays(plan)
    meta = {
        "format": FORMAT,
        "fingerprint": plan.fingerprint,
        "transport": plan.transport,
        "bucket_bytes": int(plan.bucket_bytes),
        "relay": bool(plan.relay),
        "inputs": describe_inputs(plan.model, plan.train, plan.infer, plan.topology),
        "dtypes": _field_dtypes(plan.units),
        "counts": {"units": len(plan.units), "rounds": len(plan.rounds), "buckets": len(plan.buckets),
                   "transfers": plan.num_transfers},
        "planning_s": float(plan.planning_s),
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, binary=True) as f:
        np.savez_compressed(f, **arrays)
    return path


def read_meta(path: str | os.PathLike) -> dict:
    """Only the JSON metadata of a plan file."""
    with _open(path) as z:
        return _meta(z, path)


def _open(path):
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise PlanError(f"{path}: not a reshardctl plan file ({e})") from None


def _meta(z, path) -> dict:
    if "meta" not in z.files:
        raise PlanError(f"{path}: not a reshardctl plan file (no 'meta' entry)")
    try:
        meta = loads_json(bytes(z["meta"]))
    except (LoadError, ValueError) as e:
        raise PlanError(f"{path}: unreadable plan metadata ({e})") from None
    if meta.get("format") != FORMAT:
        raise PlanError(f"{path}: format {meta.get('format')!r}, this reshardctl reads {FORMAT!r}")
    return meta


def _box(flat: list[int]) -> tuple[tuple[int, int], ...]:
    return tuple((int(flat[k]), int(flat[k + 1])) for k in range(0, len(flat), 2))


def load_plan(path: str | os.PathLike, model: ModelSpec, train: SideLayout, infer: SideLayout,
              topology: Topology) -> Plan:
    """Rebuild a saved plan for these inputs; ``PlanError`` (naming the file and the mismatch) when
    the recomputed fingerprint differs from the stored one."""
    from reshardctl.plan.planner import fingerprint

    try:
        with _open(path) as z:
            meta = _meta(z, path)
            a = {k: z[k] for k in z.files if k != "meta"}
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as e:
        raise PlanError(f"{path}: damaged plan file ({e})") from None
    try:
        plan = _rebuild(meta, a, model, train, infer, topology)
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise PlanError(f"{path}: damaged plan file ({type(e).__name__}: {e})") from None
    got = fingerprint(plan)
    if got != meta["fingerprint"]:
        stored = meta.get("inputs", {})
        now = describe_inputs(model, train, infer, topology)
        diffs = [f"{k}: file {stored.get(k)!r}, now {now[k]!r}" for k in now
                 if k not in ("model_source",) and stored.get(k) != now[k]]
        what = "; ".join(diffs) if diffs else "the inputs describe the same, so the plan content differs (damaged file, or written by a different planner)"
        raise PlanError(f"{path}: plan fingerprint {meta['fingerprint']} does not match these inputs "
                        f"(recomputed {got}): {what}",
                        hint="re-run `reshardctl plan` with the current inputs")
    return plan


def _rebuild(meta, a, model, train, infer, topology) -> Plan:
    dts = meta["dtypes"]
    units = []
    toff, boff, tab_off = a["unit_tensors_off"], a["box_off"], a["tab_off"]
    for k in range(len(a["unit_stage"])):
        nd = int(a["unit_ndim"][k])
        s, e = int(tab_off[k]), int(tab_off[k + 1])
        n = e - s
        lo = a["tab_lo"][boff[k] : boff[k + 1]].astype(dts["lo"]).reshape(n, nd)
        hi = a["tab_hi"][boff[k] : boff[k + 1]].astype(dts["hi"]).reshape(n, nd)
        table = TransferTable(
            a["tab_src"][s:e].astype(dts["src"]),
            a["tab_dst"][s:e].astype(dts["dst"]),
            a["tab_stage"][s:e].astype(dts["stage"]),
            lo,
            hi,
            a["tab_nbytes"][s:e].astype(dts["nbytes"]),
        )
        tensors = a["unit_tensors"][toff[k] : toff[k + 1]].astype(dts["tensors"])
        units.append(Unit(tensors, table, int(a["unit_stage"][k]), int(a["unit_itemsize"][k])))
    rounds = []
    ent = a["round_entries"].reshape(-1, 5).astype(np.int64)
    roff = a["round_off"].tolist()
    for r, (idx, st) in enumerate(zip(a["round_index"].tolist(), a["round_stage"].tolist())):
        rounds.append(Round(idx, st, entry_array(ent[roff[r] : roff[r + 1]])))
    buckets = []
    hdr = a["bucket_hdr"].reshape(-1, 3).tolist()
    grp, goff = a["bucket_group"].tolist(), a["bucket_group_off"].tolist()
    ten, tnoff = a["bucket_tensors"].tolist(), a["bucket_tensors_off"].tolist()
    peers, poff = a["bucket_gather_peer"].tolist(), a["bucket_gather_off"].tolist()
    rgoff = a["gather_regions_off"].tolist()
    rt, rn, rd = a["region_tensor"].tolist(), a["region_nbytes"].tolist(), a["region_ndim"].tolist()
    rbox = a["region_box"].tolist()
    box_start = [0]
    for d in rd:
        box_start.append(box_start[-1] + 2 * d)
    peer_k = 0
    for b, (idx, root, nbytes) in enumerate(hdr):
        gather = []
        for p in range(poff[b], poff[b + 1]):
            regs = tuple(Region(rt[j], _box(rbox[box_start[j] : box_start[j + 1]]), rn[j])
                         for j in range(rgoff[peer_k], rgoff[peer_k + 1]))
            gather.append(PeerRegions(peers[p], regs))
            peer_k += 1
        buckets.append(BroadcastBucket(idx, root, tuple(grp[goff[b] : goff[b + 1]]), tuple(ten[tnoff[b] : tnoff[b + 1]]),
                                       tuple(gather), nbytes))
    plan = Plan(
        transport=meta["transport"],
        model=model,
        train=train,
        infer=infer,
        topology=topology,
        bucket_bytes=int(meta["bucket_bytes"]),
        relay=bool(meta["relay"]),
        units=tuple(units),
        rounds=tuple(rounds),
        buckets=tuple(buckets),
    )
    object.__setattr__(plan, "fingerprint", meta["fingerprint"])
    object.__setattr__(plan, "planning_s", float(meta.get("planning_s", 0.0)))
    return plan


__all__ = ["FORMAT", "describe_inputs", "load_plan", "model_digest", "read_meta", "save_plan"]
