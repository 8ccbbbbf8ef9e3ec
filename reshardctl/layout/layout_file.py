"""Generic layout files (YAML/JSON): per tensor-name pattern a mesh and DTensor placements.

The data model is the one NCCL M2N and NeMo RL reshard use (a mesh + placements per HF weight), plus an
explicit per-tensor form (templates of boxes + ranks) that ``export_layout_file`` writes for ANY
``SideLayout`` and that loads back to an identical layout. Format: docs/layouts.md, "Generic layout files".
"""

from __future__ import annotations

import json
import os
import re
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from reshardctl.atomic_write import write_text_atomic
from reshardctl.bounded_load import LoadError, load_file
from reshardctl.errors import LayoutError
from reshardctl.layout.dtensor import (
    DTensorLayout,
    DTensorPlacement,
    Mesh,
    Partial,
    Replicate,
    Rule,
    Shard,
    StridedShard,
    intern_template,
)
from reshardctl.layout.placement import Placement
from reshardctl.layout.safe_regex import regex_problem
from reshardctl.layout.side import Side, SideLayout
from reshardctl.models.spec import ModelSpec

FORMAT = "reshardctl-layout/1"
# Input limits (docs/layouts.md): size and values of a file before anything is built, ranks of a layout,
# and the grid of the coverage check.
MAX_LAYOUT_BYTES = 256 << 20
MAX_LAYOUT_VALUES = 20_000_000
MAX_WORLD = 1 << 20
MAX_CELLS = 1 << 24
_TOP_KEYS = {"format", "world_size", "side", "meshes", "stages", "rules", "default", "templates", "tensors"}
_RULE_KEYS = {"match", "mesh", "placements", "shape", "dtype", "stage", "fsdp2_physical"}
_MESH_KEYS = {"shape", "dim_names", "ranks"}
_TENSOR_KEYS = {"template", "shape", "slots", "ranks", "stage"}

_INT = r"\s*(-?\d+)\s*"
_PLACEMENT_RES = [
    (re.compile(rf"(?:Shard|S)\((?:dim\s*=)?{_INT}\)"), lambda m: Shard(int(m[1]))),
    (re.compile(r"(?:Replicate\(\s*\)|Replicate|R(?:\(\s*\))?)"), lambda m: Replicate()),
    (
        re.compile(rf"_?(?:StridedShard|S)\((?:dim\s*=)?{_INT},\s*(?:split_factor\s*=|sf\s*=)?{_INT}\)"),
        lambda m: StridedShard(int(m[1]), int(m[2])),
    ),
    (
        re.compile(r"(?:Partial|P)(?:\(\s*(?:reduce_op\s*=\s*)?['\"]?(\w*)['\"]?\s*\))?"),
        lambda m: Partial(m[1] or "sum"),
    ),
]


def parse_placement(value: Any) -> DTensorPlacement:
    """``"Shard(0)"``, ``"S(0)"``, ``"Replicate()"``, ``"R"``, ``"_StridedShard(0, 2)"``, ``"_S(0,2)"``,
    ``"Partial(sum)"``; or ``{"shard": 0}``, ``{"replicate": true}``, ``"replicate"``,
    ``{"strided_shard": 0, "split_factor": 2}``, ``{"partial": "sum"}``. ``ValueError`` otherwise."""
    if isinstance(value, str):
        s = value.strip()
        if s.lower() == "replicate":
            return Replicate()
        for rx, make in _PLACEMENT_RES:
            m = rx.fullmatch(s)
            if m:
                return make(m)
        raise ValueError(f"bad placement {_short(value)} (expected e.g. 'Shard(0)', 'Replicate()', '_StridedShard(0, 2)')")
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"shard"} and _is_int(value["shard"]):
            return Shard(value["shard"])
        if keys == {"replicate"}:
            return Replicate()
        if keys == {"strided_shard", "split_factor"} and _is_int(value["strided_shard"]) and _is_int(value["split_factor"]):
            return StridedShard(value["strided_shard"], value["split_factor"])
        if keys == {"partial"}:
            return Partial(str(value["partial"] or "sum"))
    raise ValueError(f"bad placement {_short(value)} (expected a string like 'Shard(0)' or a mapping like {{shard: 0}})")


def _short(x: Any) -> str:
    text = repr(x) if not isinstance(x, (list, dict)) or len(x) <= 8 else f"a {type(x).__name__} of {len(x):,} items"
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_list(x: Any) -> bool:
    return isinstance(x, list) and all(_is_int(v) for v in x)


class _Problems(list):
    def unknown(self, where: str, d: dict, allowed: set) -> None:
        for k in d:
            if k not in allowed:
                self.append(f"{where}: unknown key {_short(k)} (allowed: {', '.join(sorted(allowed))})")


def _parse_mesh(raw: Any, where: str, named: dict[str, Mesh], probs: _Problems, world: int | None = None) -> Mesh | None:
    if isinstance(raw, str):
        if raw in named:
            return named[raw]
        probs.append(f"{where}: no mesh named {_short(raw)} under 'meshes' (have: {', '.join(sorted(named)) or 'none'})")
        return None
    if not isinstance(raw, dict):
        probs.append(f"{where}: a mesh is a mapping {{shape, dim_names, ranks}} or the name of one under 'meshes'")
        return None
    probs.unknown(where, raw, _MESH_KEYS)
    shape = raw.get("shape")
    if not _int_list(shape) or not shape:
        probs.append(f"{where}.shape: expected a non-empty list of ints, got {_short(shape)}")
        return None
    size = prod(shape) if all(k >= 1 for k in shape) else 0
    if size > MAX_WORLD:  # checked before the mesh's rank array is built (ranks vs world_size: later)
        probs.append(f"{where}.shape: {' x '.join(map(str, shape))} = {size:,} ranks, more than the limit of "
                     f"{MAX_WORLD:,} (MAX_WORLD)" + (f"; world_size is {world}" if world is not None else ""))
        return None
    names = raw.get("dim_names", [f"d{i}" for i in range(len(shape))])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        probs.append(f"{where}.dim_names: expected a list of strings, got {_short(names)}")
        return None
    try:
        return Mesh.of(shape, names, raw.get("ranks"))
    except (LayoutError, ValueError, TypeError) as e:
        msgs = e.violations if isinstance(e, LayoutError) else [str(e)]
        probs.extend(f"{where}: {m}" for m in msgs)
        return None


def _parse_rule(raw: Any, where: str, named: dict[str, Mesh], probs: _Problems, is_default=False,
                world: int | None = None) -> Rule | None:
    if not isinstance(raw, dict):
        probs.append(f"{where}: expected a mapping, got {type(raw).__name__}")
        return None
    probs.unknown(where, raw, _RULE_KEYS - ({"match"} if is_default else set()))
    n0 = len(probs)
    pattern = "*" if is_default else raw.get("match")
    if not isinstance(pattern, str) or not pattern:
        probs.append(f"{where}.match: expected a glob or 're:<regex>' string, got {_short(pattern)}")
    elif pattern.startswith("re:"):
        why = regex_problem(pattern[3:])
        if why:
            probs.append(f"{where}.match: regex {_short(pattern[3:])} refused: {why}")
    mesh = _parse_mesh(raw.get("mesh"), f"{where}.mesh", named, probs, world) if "mesh" in raw else None
    if "mesh" not in raw:
        probs.append(f"{where}: missing 'mesh'")
    pls = raw.get("placements")
    placements: list[DTensorPlacement] = []
    if not isinstance(pls, list):
        probs.append(f"{where}.placements: expected a list (one per mesh dim), got {_short(pls)}")
    else:
        for k, v in enumerate(pls):
            try:
                placements.append(parse_placement(v))
            except ValueError as e:
                probs.append(f"{where}.placements[{k}]: {e}")
                placements.append(Replicate())  # placeholder: the rule still claims its tensors, so the
                # layout checks in load_layout_file report only real problems
    shape = raw.get("shape")
    if shape is not None and not _int_list(shape):
        probs.append(f"{where}.shape: expected a list of ints, got {_short(shape)}")
    stage = raw.get("stage")
    if stage is not None and (not _is_int(stage) or stage < 0):
        probs.append(f"{where}.stage: expected an int >= 0, got {_short(stage)}")
    fsdp = raw.get("fsdp2_physical", False)
    if not isinstance(fsdp, bool):
        probs.append(f"{where}.fsdp2_physical: expected true/false, got {_short(fsdp)}")
    if mesh is None or any(not p.startswith(f"{where}.placements[") for p in probs[n0:]):
        return None  # only a rule whose sole problems are unparsable placements is kept (with placeholders)
    return Rule(pattern, mesh, tuple(placements), stage, fsdp, tuple(shape) if shape else None, raw.get("dtype"), where)


def _parse_explicit(doc: dict, model: ModelSpec, probs: _Problems):
    templates = []
    raw_templates = doc.get("templates") or []
    if not isinstance(raw_templates, list):
        probs.append(f"templates: expected a list of {{shape, slots}}, got {_short(raw_templates)}")
        raw_templates = None
    for i, t in enumerate(raw_templates or []):
        where = f"templates[{i}]"
        try:
            templates.append(_template(t.get("shape"), t.get("slots")) if isinstance(t, dict) else None)
            if isinstance(t, dict):
                probs.unknown(where, t, {"shape", "slots"})
        except (ValueError, TypeError) as e:
            probs.append(f"{where}: {e}")
            templates.append(None)
    explicit: dict[str, Placement] = {}
    stages: dict[str, int] = {}
    names = {t.name for t in model.tensors}
    tensors = doc.get("tensors") or {}
    if not isinstance(tensors, dict):
        probs.append("tensors: expected a mapping name -> {template|shape+slots, ranks, stage}")
        return explicit, stages
    unknown = [n for n in tensors if n not in names]
    if unknown:
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        probs.append(f"tensors: {len(unknown)} names not in model {model.name}: {', '.join(unknown[:10])}{more}")
    for name, e in tensors.items():
        where = f"tensors[{_short(name)}]"
        if not isinstance(e, dict):
            probs.append(f"{where}: expected a mapping")
            continue
        probs.unknown(where, e, _TENSOR_KEYS)
        try:
            if "template" in e:
                k = e["template"]
                if raw_templates is None or (_is_int(k) and 0 <= k < len(templates) and templates[k] is None):
                    continue  # the templates (or this one) are already reported
                tpl = templates[k] if _is_int(k) and 0 <= k < len(templates) else None
                if tpl is None:
                    raise ValueError(f"template {_short(k)} is not a valid index into 'templates'")
            else:
                tpl = _template(e.get("shape"), e.get("slots"))
            ranks = e.get("ranks")
            if not _int_list(ranks):
                raise ValueError(f"ranks: expected a list of ints, got {_short(ranks)}")
            explicit[name] = Placement(tpl, tuple(ranks))
            st = e.get("stage", 0)
            if not _is_int(st) or st < 0:
                raise ValueError(f"stage: expected an int >= 0, got {_short(st)}")
            stages[name] = st
        except (ValueError, TypeError, KeyError) as err:
            probs.append(f"{where}: {err}")
    return explicit, stages


def _interval(iv: Any) -> bool:
    return isinstance(iv, list) and len(iv) == 2 and _is_int(iv[0]) and _is_int(iv[1])


def _template(shape, slots):
    """A template from ``shape`` and per-slot box lists: every box ``[[lo, hi], ...]`` of integers inside
    the shape, and the slots together holding every element (a layout with holes would silently move
    only part of a tensor; the same rule for trainer and inference layouts)."""
    if not _int_list(shape) or len(shape) > 8 or any(not 0 <= n <= 1 << 40 for n in shape):
        raise ValueError(f"shape: expected a list of at most 8 ints >= 0, got {_short(shape)}")
    if not isinstance(slots, list) or len(slots) > MAX_WORLD:
        raise ValueError(f"slots: expected a list (one list of boxes per slot, at most {MAX_WORLD:,}), got {_short(slots)}")
    for s, boxes in enumerate(slots):
        if not isinstance(boxes, list):
            raise ValueError(f"slots[{s}]: expected a list of boxes, got {_short(boxes)}")
        for b in boxes:
            if not isinstance(b, list) or len(b) != len(shape) or not all(_interval(iv) for iv in b):
                raise ValueError(f"slots[{s}]: box {_short(b)} must be one [lo, hi] pair of integers per dim "
                                 f"(shape {shape})")
            if any(not (0 <= lo < hi <= n) for (lo, hi), n in zip(b, shape)):
                raise ValueError(f"slots[{s}]: box {_short(b)} is empty or outside shape {shape}")
    held, total = covered(shape, [tuple(tuple(iv) for iv in b) for boxes in slots for b in boxes])
    if held != total:
        raise ValueError(f"the slots hold {held:,} of the {total:,} elements of shape {shape}: every element "
                         "must be held by some rank (a hole would never be refitted)")
    return intern_template(shape, slots)


def covered(shape, boxes) -> tuple[int, int]:
    """(elements of ``shape`` inside the union of ``boxes``, elements of ``shape``). The boxes cut each
    dim into segments; a grid of those cells is marked box by box (at most ``MAX_CELLS`` cells)."""
    total = prod(shape)
    boxes = list(dict.fromkeys(boxes))  # replicas hold identical boxes
    if not boxes or total == 0:
        return 0, total
    edges = [np.unique(np.asarray([[lo, hi] for lo, hi in (b[d] for b in boxes)], dtype=np.int64))
             for d in range(len(shape))]
    cells = prod(len(e) - 1 for e in edges)
    if cells > MAX_CELLS:
        raise ValueError(f"{len(boxes):,} distinct boxes cut shape {list(shape)} into {cells:,} cells, more than "
                         f"the {MAX_CELLS:,} this check allows (MAX_CELLS); use fewer, larger boxes")
    grid = np.zeros([len(e) - 1 for e in edges], dtype=bool)
    for b in boxes:
        grid[tuple(slice(int(np.searchsorted(e, lo)), int(np.searchsorted(e, hi))) for e, (lo, hi) in zip(edges, b))] = True
    sizes = [np.diff(e) for e in edges]
    held = int(np.einsum(grid.astype(np.int64), list(range(len(shape))), *[x for d, sz in enumerate(sizes) for x in (sz, [d])], []))  # noqa: E501
    return held, total


def load_layout_file(path: str | os.PathLike, model: ModelSpec, side: Side) -> DTensorLayout:
    """Read a layout file into a ``DTensorLayout``; ``LayoutError`` lists every problem, each prefixed by
    the file and the key path (``rules[2].placements[1]``)."""
    path = Path(path)
    try:
        doc = load_file(path, "json" if path.suffix == ".json" else "yaml", max_bytes=MAX_LAYOUT_BYTES,
                        max_nodes=MAX_LAYOUT_VALUES)
    except LoadError as e:
        what = "cannot read layout file" if e.reading else f"not a valid {'JSON' if path.suffix == '.json' else 'YAML'} layout file"
        raise LayoutError(f"{path}: {what}: {e}") from None
    probs = _Problems()
    if not isinstance(doc, dict):
        raise LayoutError(f"{path}: top level must be a mapping")
    probs.unknown("top level", doc, _TOP_KEYS)
    if doc.get("format", FORMAT) != FORMAT:
        probs.append(f"format: {_short(doc['format'])} is not {FORMAT!r}")
    world = doc.get("world_size")
    if not _is_int(world) or not 1 <= world <= MAX_WORLD:
        probs.append(f"world_size: expected an int between 1 and {MAX_WORLD:,} (MAX_WORLD), got {_short(world)}")
    if doc.get("side", side) != side:
        probs.append(f"side: file is for {_short(doc['side'])}, loaded as {side!r}")
    world_ok = _is_int(world) and 1 <= world <= MAX_WORLD
    named: dict[str, Mesh] = {}
    meshes = doc.get("meshes") or {}
    if not isinstance(meshes, dict):
        probs.append(f"meshes: expected a mapping name -> {{shape, dim_names, ranks}}, got {_short(meshes)}")
        meshes = {}
    for name, m in meshes.items():
        mesh = _parse_mesh(m, f"meshes.{name}", named, probs, world if world_ok else None)
        if mesh is not None:
            named[name] = mesh
    rules_raw = doc.get("rules") or []
    if not isinstance(rules_raw, list):
        probs.append("rules: expected a list")
        rules_raw = []
    w = world if world_ok else None
    rules = [_parse_rule(r, f"rules[{i}]", named, probs, world=w) for i, r in enumerate(rules_raw)]
    default = _parse_rule(doc["default"], "default", named, probs, is_default=True, world=w) if doc.get("default") else None
    explicit, stages = _parse_explicit(doc, model, probs)
    stage_ranks = doc.get("stages")
    if stage_ranks is not None and not (isinstance(stage_ranks, list) and all(_int_list(s) for s in stage_ranks)):
        probs.append(f"stages: expected a list of rank lists, got {_short(stage_ranks)}")
        stage_ranks = None
    if stage_ranks is not None and world_ok:
        for i, ranks in enumerate(stage_ranks):
            bad = sorted({r for r in ranks if not 0 <= r < world})
            if bad:
                probs.append(f"stages[{i}]: ranks {bad[:10]} are outside world_size {world} (ranks 0..{world - 1})")
    # The layout checks (mesh ranks vs world_size, Shard dims vs tensor ranks, unmatched tensors) run even
    # when parsing found problems, so one message lists everything; but only when every rule and tensor
    # entry is usable, else tensors would fall through to other rules and give misleading reports.
    usable = world_ok and all(r is not None for r in rules) and (
        not doc.get("default") or default is not None) and (
        not isinstance(doc.get("tensors") or {}, dict) or len(explicit) == len(doc.get("tensors") or {}))
    if not probs or usable:
        try:
            lay = DTensorLayout(
                model, side, world, [r for r in rules if r is not None], default,
                explicit=explicit, explicit_stages=stages, stage_ranks=stage_ranks, source=str(path),
            )
        except LayoutError as e:
            probs.extend(e.violations)
        else:
            if not probs:
                return lay
    err = LayoutError([f"{path}: {p}" for p in probs])
    err.world_size = world if world_ok else None  # type: ignore[attr-defined]  (for the allocation check)
    raise err


def layout_to_doc(layout: SideLayout) -> dict:
    """The explicit per-tensor form of any ``SideLayout`` (shared templates listed once)."""
    tids: dict[int, int] = {}
    templates: list[dict] = []
    tensors: dict[str, dict] = {}
    multi = layout.num_stages() > 1
    for i, t in enumerate(layout.model.tensors):
        p = layout.placement(i)
        k = tids.get(id(p.template))
        if k is None:
            k = tids[id(p.template)] = len(templates)
            templates.append({
                "shape": list(p.template.shape),
                "slots": [[[list(iv) for iv in box] for box in h] for h in p.template.holdings],
            })
        entry = {"template": k, "ranks": list(p.ranks)}
        if multi:
            entry["stage"] = layout.stage_of(i)
        tensors[t.name] = entry
    return {
        "format": FORMAT,
        "side": layout.side,
        "world_size": layout.world_size,
        "stages": [list(layout.stage_ranks(s)) for s in range(layout.num_stages())],
        "templates": templates,
        "tensors": tensors,
    }


def export_layout_file(layout: SideLayout, path: str | os.PathLike, on_write=None) -> Path:
    """Write ``layout`` in explicit form (JSON for ``.json``, YAML otherwise), atomically. ``on_write()``,
    if given, is called between building the document and writing it (the command's progress)."""
    path = Path(path)
    doc = layout_to_doc(layout)
    if on_write is not None:
        on_write()
    if path.suffix == ".json":
        text = json.dumps(doc, separators=(",", ":")) + "\n"
    else:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    return write_text_atomic(path, text)
