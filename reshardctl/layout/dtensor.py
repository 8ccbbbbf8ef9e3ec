"""DTensor algebra: a device mesh plus per-mesh-dim placements -> the index set each rank holds.

Semantics are torch 2.13's (``torch/distributed/tensor/placement_types.py``: ``Shard._split_tensor``,
``_StridedShard``; ``torch/distributed/tensor/_utils.py``: ``_compute_local_shape_and_global_offset``;
tests use torch's own placement code as the oracle):

* ``Shard(d)`` is ``torch.chunk`` of the *current local* index list of tensor dim ``d``: ceil-sized
  chunks, trailing chunks may be empty (n=5 over 4 -> sizes 2,2,1,0).
* Placements apply left to right over mesh dims. A tensor dim sharded by two mesh dims is re-chunked
  from the local list the earlier mesh dim left (nesting), which is *not* one flat split by the
  product when sizes are uneven::

      n=10, mesh (2,3), (Shard(0), Shard(0))
      mesh dim 0:   [0 1 2 3 4 | 5 6 7 8 9]
      mesh dim 1:   [0 1|2 3|4] [5 6|7 8|9]      flat split into 6 would give [0 1|2 3|4 5|6 7|8 9|]

* ``StridedShard(d, sf)`` (torch ``_StridedShard``): chunk the current local list into ``sf`` pieces,
  chunk each piece into ``k`` sub-pieces; rank ``i`` holds the ``i``-th sub-piece of every piece::

      n=8, k=2, sf=2:  pieces [0 1 2 3] [4 5 6 7] -> rank 0 {0,1,4,5}, rank 1 {2,3,6,7}

* ``Replicate()``: every coordinate on that mesh dim holds the same set.
* ``Partial`` is rejected: a partial sum cannot be byte-copied.

``fsdp2_tp`` models FSDP2 + TP in its *physical* storage order (TP first, FSDP chunk of the local
piece), which differs from the ``(_StridedShard, Shard)`` description when sizes are uneven.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, Union

import numpy as np

from reshardctl.errors import LayoutError
from reshardctl.layout.indexset import IndexSet, IntervalSet
from reshardctl.layout.placement import Placement, ShardTemplate
from reshardctl.layout.side import Side, SideLayout
from reshardctl.models.spec import ModelSpec


# placements --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Shard:
    dim: int

    def __str__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True, slots=True)
class Replicate:
    def __str__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True, slots=True)
class StridedShard:
    dim: int
    split_factor: int

    def __str__(self) -> str:
        return f"_StridedShard({self.dim}, {self.split_factor})"


@dataclass(frozen=True, slots=True)
class Partial:
    """Accepted by the parser so the error can name it; rejected by every layout computation."""

    reduce_op: str = "sum"

    def __str__(self) -> str:
        return f"Partial({self.reduce_op})"


DTensorPlacement = Union[Shard, Replicate, StridedShard, Partial]


# mesh --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mesh:
    """A device mesh: ``shape``, one name per dim and the side-local rank at every coordinate.

    ``ranks`` is the flattened (row-major) rank array; pass any nested sequence or numpy array of
    ``shape`` to ``Mesh.of``. Any permutation is allowed (torch's coordinate of a rank is its position
    in ``mesh.mesh``).
    """

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(k) for k in self.shape))
        object.__setattr__(self, "dim_names", tuple(self.dim_names))
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        problems = []
        if not self.shape or any(int(k) < 1 for k in self.shape):
            problems.append(f"mesh shape {list(self.shape)} must have at least one dim, each >= 1")
        if len(self.dim_names) != len(self.shape):
            problems.append(f"mesh has {len(self.shape)} dims but {len(self.dim_names)} dim names {list(self.dim_names)}")
        elif len(set(self.dim_names)) != len(self.dim_names):
            problems.append(f"mesh dim names {list(self.dim_names)} are not unique")
        n = int(np.prod(self.shape)) if self.shape else 0
        if len(self.ranks) != n:
            problems.append(f"mesh shape {list(self.shape)} has {n} coordinates but {len(self.ranks)} ranks are given")
        if len(set(self.ranks)) != len(self.ranks):
            dup = sorted({r for r in self.ranks if self.ranks.count(r) > 1})
            problems.append(f"mesh ranks are not unique (repeated: {dup[:10]})")
        if any(r < 0 for r in self.ranks):
            problems.append("mesh ranks must be >= 0")
        if problems:
            raise LayoutError(problems)

    @classmethod
    def of(cls, shape: Sequence[int], dim_names: Sequence[str] | None = None, ranks=None) -> Mesh:
        shape = tuple(int(k) for k in shape)
        names = tuple(dim_names) if dim_names is not None else tuple(f"d{i}" for i in range(len(shape)))
        if ranks is None:
            flat = tuple(range(int(np.prod(shape)) if shape else 0))
        else:
            arr = np.asarray(ranks)
            if arr.shape != shape:
                raise LayoutError(f"mesh ranks array has shape {list(arr.shape)}, mesh shape is {list(shape)}")
            flat = tuple(int(r) for r in arr.ravel())
        return cls(shape, names, flat)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def coords(self) -> list[tuple[int, ...]]:
        """Every coordinate in row-major order (slot order of templates)."""
        return [tuple(int(c) for c in x) for x in np.ndindex(*self.shape)]

    def rank_at(self, coord: Sequence[int]) -> int:
        return self.ranks[int(np.ravel_multi_index(tuple(coord), self.shape))]

    def coord_of(self, rank: int) -> tuple[int, ...]:
        return tuple(int(c) for c in np.unravel_index(self.ranks.index(rank), self.shape))


# index sets --------------------------------------------------------------------------------------
def strided_chunk(s: IntervalSet, num_chunks: int, i: int, split_factor: int) -> IntervalSet:
    """torch 2.13 ``_StridedShard._split_tensor``: chunk into ``split_factor`` pieces, chunk each into
    ``num_chunks``, take the ``i``-th sub-piece of every piece."""
    out = IntervalSet.empty()
    for j in range(split_factor):
        out = out.union(s.chunk(split_factor, j).chunk(num_chunks, i))
    return out


def normalize_placements(placements: Sequence[DTensorPlacement], ndim: int) -> tuple[DTensorPlacement, ...]:
    """Negative tensor dims counted from the end, as torch does (``Shard(-1)`` of a 2-d tensor = ``Shard(1)``)."""
    out = []
    for p in placements:
        if isinstance(p, Shard) and -ndim <= p.dim < 0:
            p = Shard(p.dim + ndim)
        elif isinstance(p, StridedShard) and -ndim <= p.dim < 0:
            p = StridedShard(p.dim + ndim, p.split_factor)
        out.append(p)
    return tuple(out)


def check_placements(
    global_shape: Sequence[int], mesh: Mesh, placements: Sequence[DTensorPlacement], what: str = "tensor"
) -> list[str]:
    """Every reason these placements cannot describe ``global_shape`` on ``mesh`` (empty list: fine)."""
    problems = []
    if len(placements) != mesh.ndim:
        problems.append(f"{what}: {len(placements)} placements for a {mesh.ndim}-d mesh {list(mesh.dim_names)}")
    for m, p in enumerate(placements):
        name = mesh.dim_names[m] if m < mesh.ndim else str(m)
        if isinstance(p, Partial):
            problems.append(
                f"{p} on mesh dim '{name}' of {what}: a partial sum cannot be byte-copied; "
                "reduce it to Replicate/Shard before the refit"
            )
        elif isinstance(p, (Shard, StridedShard)):
            if not 0 <= p.dim < len(global_shape):
                problems.append(f"{p} on mesh dim '{name}' of {what}: tensor has {len(global_shape)} dims {list(global_shape)}")
            if isinstance(p, StridedShard) and p.split_factor < 1:
                problems.append(f"{p} on mesh dim '{name}' of {what}: split_factor must be >= 1")
        elif not isinstance(p, Replicate):
            problems.append(f"mesh dim '{name}' of {what}: unknown placement {p!r}")
    return problems


def _coord_sets(global_shape, mesh_shape, placements, coord) -> list[IntervalSet]:
    cur = [IntervalSet.full(n) for n in global_shape]
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            cur[p.dim] = cur[p.dim].chunk(mesh_shape[m], coord[m])
        elif isinstance(p, StridedShard):
            cur[p.dim] = strided_chunk(cur[p.dim], mesh_shape[m], coord[m], p.split_factor)
    return cur


def coord_index_sets(
    global_shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[DTensorPlacement]
) -> list[IndexSet]:
    """Index set of every mesh coordinate, row-major mesh order (ranks not needed)."""
    shape = tuple(int(n) for n in global_shape)
    mesh_shape = tuple(mesh_shape)
    return [IndexSet(shape, _coord_sets(shape, mesh_shape, placements, c)) for c in np.ndindex(*mesh_shape)]


def local_index_sets(
    global_shape: Sequence[int], mesh: Mesh, placements: Sequence[DTensorPlacement], *, what: str = "tensor"
) -> dict[int, IndexSet]:
    """Side-local rank -> the index set it holds (torch.chunk semantics, nested left to right)."""
    placements = normalize_placements(placements, len(global_shape))
    problems = check_placements(global_shape, mesh, placements, what)
    if problems:
        raise LayoutError(problems)
    sets = coord_index_sets(global_shape, mesh.shape, placements)
    return dict(zip(mesh.ranks, sets))


def fsdp2_tp(
    global_shape: Sequence[int],
    tp: int,
    dp: int,
    shard_dim: int = 0,
    *,
    tp_dim: int | None = None,
    mesh: Mesh | None = None,
) -> dict[int, IndexSet]:
    """FSDP2 + TP in *physical* storage order on mesh ``(dp, tp)`` (default ranks ``dp_i * tp + tp_j``).

    TP ``torch.chunk``s the global tensor along ``tp_dim`` (default ``shard_dim``) first; FSDP2 then
    ``torch.chunk``s the TP-local piece along ``shard_dim`` into ``dp`` pieces (``_chunk_with_empty``) and
    stores piece ``dp_i`` on coordinate ``(dp_i, tp_j)``.

    Where this differs from the DTensor description: FSDP2 labels the parameter
    ``(_StridedShard(shard_dim, tp), Shard(tp_dim))``. Its placement semantics chunk the global dim into
    ``tp`` pieces and each piece into ``dp`` (then Shard re-chunks), which equals the physical order only
    when the sizes divide evenly. Uneven example n=7, dp=3, tp=2: physically (2,0) holds nothing and
    (2,1) holds row 6; the ``_StridedShard`` semantics give (2,0)={6}, (2,1)={}. The physical order is
    ``FSDPParam._init_sharded_param`` in ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``
    (``_chunk_with_empty`` of the TP-local tensor, ``_fsdp_common.py``).
    Bytes live where the physical order says, so refits must use this function.

    FSDP2 only allows an uneven split on dim 0; ``shard_dim > 0`` with a TP-local size not divisible by
    ``dp`` is rejected as torch does.
    """
    shape = tuple(int(n) for n in global_shape)
    tdim = shard_dim if tp_dim is None else tp_dim
    if mesh is None:
        mesh = Mesh.of((dp, tp), ("dp", "tp"))
    problems = []
    if mesh.shape != (dp, tp):
        problems.append(f"fsdp2_tp: mesh shape {list(mesh.shape)} is not (dp={dp}, tp={tp})")
    for label, d in (("shard_dim", shard_dim), ("tp_dim", tdim)):
        if not 0 <= d < len(shape):
            problems.append(f"fsdp2_tp: {label} {d} out of range for shape {list(shape)}")
    if problems:
        raise LayoutError(problems)
    out: dict[int, IndexSet] = {}
    for i, j in np.ndindex(dp, tp):
        cur = [IntervalSet.full(n) for n in shape]
        cur[tdim] = cur[tdim].chunk(tp, j)
        if shard_dim != 0 and cur[shard_dim].size % dp:
            raise LayoutError(
                f"fsdp2_tp: FSDP2 shards dim {shard_dim} of {list(shape)} unevenly "
                f"(TP-local size {cur[shard_dim].size} over dp={dp}); torch allows uneven sharding on dim 0 only"
            )
        cur[shard_dim] = cur[shard_dim].chunk(dp, i)
        out[mesh.rank_at((i, j))] = IndexSet(shape, cur)
    return out


# templates ---------------------------------------------------------------------------------------
_TEMPLATES: dict[tuple, ShardTemplate] = {}
_BY_HOLDINGS: dict[tuple, ShardTemplate] = {}


def intern_template(shape: Sequence[int], holdings: Iterable[Iterable]) -> ShardTemplate:
    """The one ``ShardTemplate`` object for this (shape, holdings); equal inputs give the same object."""
    key = (tuple(shape), tuple(tuple(tuple(tuple(iv) for iv in b) for b in h) for h in holdings))
    t = _BY_HOLDINGS.get(key)
    if t is None:
        t = _BY_HOLDINGS.setdefault(key, ShardTemplate(key[0], key[1]))
    return t


def template_of(
    global_shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[DTensorPlacement]
) -> ShardTemplate:
    """Interned template: one slot per mesh coordinate (row-major), holdings = ``IndexSet.boxes()``."""
    key = (tuple(int(n) for n in global_shape), tuple(mesh_shape), tuple(placements))
    t = _TEMPLATES.get(key)
    if t is None:
        sets = coord_index_sets(key[0], key[1], key[2])
        t = _TEMPLATES.setdefault(key, intern_template(key[0], [s.boxes() for s in sets]))
    return t


def to_template(
    global_shape: Sequence[int], mesh: Mesh, placements: Sequence[DTensorPlacement], *, what: str = "tensor"
) -> Placement:
    """The ``Placement`` of a DTensor: an interned template pinned to the mesh's ranks (row-major)."""
    placements = normalize_placements(placements, len(global_shape))
    problems = check_placements(global_shape, mesh, placements, what)
    if problems:
        raise LayoutError(problems)
    return Placement(template_of(global_shape, mesh.shape, placements), mesh.ranks)


def fsdp2_tp_placement(global_shape: Sequence[int], mesh: Mesh, shard_dim: int = 0, tp_dim: int | None = None) -> Placement:
    """``fsdp2_tp`` as a ``Placement`` on a 2-d ``(dp, tp)`` mesh (slots in row-major mesh order)."""
    if mesh.ndim != 2:
        raise LayoutError(f"fsdp2_tp needs a 2-d (dp, tp) mesh, got {list(mesh.shape)}")
    key = ("fsdp2_tp", tuple(global_shape), mesh.shape, shard_dim, tp_dim)
    t = _TEMPLATES.get(key)
    if t is None:
        canon = Mesh.of(mesh.shape, mesh.dim_names)  # arange ranks: slot i == rank i
        sets = fsdp2_tp(global_shape, mesh.shape[1], mesh.shape[0], shard_dim, tp_dim=tp_dim, mesh=canon)
        t = _TEMPLATES.setdefault(key, intern_template(global_shape, [sets[i].boxes() for i in range(canon.size)]))
    return Placement(t, mesh.ranks)


# whole-model layout ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """Tensors whose HF name matches ``pattern`` get ``mesh`` + ``placements``.

    ``pattern`` is a glob (``fnmatch``, ``*`` also crosses dots) or ``re:<regex>`` (full match).
    ``fsdp2_physical``: the placements are FSDP2's ``(_StridedShard(d, tp), Shard(t))`` on a ``(dp, tp)``
    mesh and the bytes sit in physical order (``fsdp2_tp``), not in ``_StridedShard`` order.
    ``shape``/``dtype``: optional checks against the model. ``where``: how messages name the rule.
    """

    pattern: str
    mesh: Mesh
    placements: tuple[DTensorPlacement, ...]
    stage: int | None = None
    fsdp2_physical: bool = False
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    where: str = ""

    def matcher(self):
        import fnmatch
        import re

        src = self.pattern[3:] if self.pattern.startswith("re:") else fnmatch.translate(self.pattern)
        return re.compile(src).fullmatch

    def placement_for(self, global_shape: Sequence[int], what: str) -> Placement:
        if not self.fsdp2_physical:
            return to_template(global_shape, self.mesh, self.placements, what=what)
        p = normalize_placements(self.placements, len(global_shape))
        problems = check_placements(global_shape, self.mesh, p, what)
        if not problems and not (
            self.mesh.ndim == 2 and isinstance(p[0], (StridedShard, Shard)) and isinstance(p[1], (Shard, Replicate))
        ):
            problems.append(f"{what}: fsdp2_physical needs placements (_StridedShard(d, tp), Shard(t)) on a (dp, tp) mesh")
        if not problems and isinstance(p[0], StridedShard) and isinstance(p[1], Shard) and p[1].dim == p[0].dim \
                and p[0].split_factor != self.mesh.shape[1]:
            problems.append(f"{what}: fsdp2_physical: {p[0]} has split_factor != tp size {self.mesh.shape[1]}")
        if problems:
            raise LayoutError(problems)
        tp_dim = p[1].dim if isinstance(p[1], Shard) else None
        if tp_dim is None:  # TP replicates this tensor: plain FSDP chunk
            return to_template(global_shape, self.mesh, (Shard(p[0].dim), Replicate()), what=what)
        return fsdp2_tp_placement(global_shape, self.mesh, p[0].dim, tp_dim)


class DTensorLayout(SideLayout):
    """Every tensor of a model as a DTensor: first matching rule wins, then ``default``.

    ``explicit`` (name -> Placement) overrides rules; it is how exported per-tensor layouts come back.
    Pipeline: a single stage unless rules (or ``explicit_stages``) give ``stage``; then stages are
    ``0..max``, ``stage_of`` is the tensor's stage (0 when its rule gives none) and ``stage_ranks(s)``
    is ``stage_ranks[s]`` when given, else the sorted union of the ranks holding stage-``s`` tensors.
    """

    def __init__(
        self,
        model: ModelSpec,
        side: Side,
        world_size: int,
        rules: Sequence[Rule] = (),
        default: Rule | None = None,
        *,
        explicit: dict[str, Placement] | None = None,
        explicit_stages: dict[str, int] | None = None,
        stage_ranks: Sequence[Sequence[int]] | None = None,
        source: str = "",
    ):
        self.model, self.side, self.world_size = model, side, int(world_size)
        self.rules, self.default, self.source = tuple(rules), default, source
        explicit = explicit or {}
        explicit_stages = explicit_stages or {}
        problems: list[str] = []
        if self.world_size < 1:
            problems.append(f"world_size must be >= 1, got {world_size}")
        for r in self.rules + ((default,) if default else ()):
            bad = sorted(x for x in r.mesh.ranks if x >= self.world_size)
            if bad:
                problems.append(f"{r.where or r.pattern}: mesh ranks {bad[:10]} >= world_size {self.world_size}")
        matchers = [(r, r.matcher()) for r in self.rules]
        places: list[Placement] = []
        stages: list[int] = []
        unmatched: list[str] = []
        reported: set[tuple] = set()
        for t in model.tensors:
            what = t.name
            if t.name in explicit:
                pl = explicit[t.name]
                places.append(pl)
                stages.append(explicit_stages.get(t.name, 0))
                if pl.template.shape != tuple(t.shape):
                    problems.append(f"{t.name}: explicit shape {list(pl.template.shape)} != model shape {list(t.shape)}")
                bad = sorted({x for x in pl.ranks if not 0 <= x < self.world_size})
                if bad:
                    problems.append(f"{t.name}: ranks {bad[:10]} outside world_size {self.world_size}")
                continue
            rule = next((r for r, m in matchers if m(t.name)), default)
            if rule is None:
                unmatched.append(t.name)
                continue
            if rule.shape is not None and tuple(rule.shape) != tuple(t.shape):
                problems.append(f"{rule.where or rule.pattern}: {t.name} has shape {list(t.shape)}, rule expects {list(rule.shape)}")
            if rule.dtype is not None and rule.dtype != t.dtype:
                problems.append(f"{rule.where or rule.pattern}: {t.name} has dtype {t.dtype}, rule expects {rule.dtype}")
            try:
                places.append(rule.placement_for(t.shape, what))
            except LayoutError as e:
                key = (id(rule), len(t.shape))
                if key not in reported:  # one report per rule and tensor rank, not per tensor
                    reported.add(key)
                    problems.extend(f"{rule.where + ': ' if rule.where else ''}{v}" for v in e.violations)
                places.append(None)  # type: ignore[arg-type]
            stages.append(rule.stage or 0)
        if unmatched:
            more = f" and {len(unmatched) - 10} more" if len(unmatched) > 10 else ""
            problems.append(f"{len(unmatched)} tensors match no rule and there is no default: {', '.join(unmatched[:10])}{more}")
        self._stage_ranks = tuple(tuple(s) for s in stage_ranks) if stage_ranks is not None else None
        if self._stage_ranks is not None and stages and max(stages) >= len(self._stage_ranks):
            problems.append(f"stage {max(stages)} used but only {len(self._stage_ranks)} stage rank lists given")
        if problems:
            raise LayoutError(problems)
        self._places = tuple(places)
        self._stages = tuple(stages)
        self._num_stages = max(stages, default=0) + 1

    def describe(self) -> str:
        src = f" from {self.source}" if self.source else ""
        return f"dtensor {len(self.rules)} rules{' + default' if self.default else ''}, world={self.world_size}{src}"

    def placement(self, index: int) -> Placement:
        return self._places[index]

    def num_stages(self) -> int:
        return self._num_stages

    def stage_of(self, index: int) -> int:
        return self._stages[index]

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        if self._stage_ranks is not None:
            return self._stage_ranks[stage]
        if self._num_stages == 1:
            return tuple(range(self.world_size))
        cache = self.__dict__.setdefault("_stage_rank_cache", {})
        if stage not in cache:
            rs: set[int] = set()
            for p, s in zip(self._places, self._stages):
                if s == stage:
                    rs.update(r for r, h in p.items() if h)
            cache[stage] = tuple(sorted(rs))
        return cache[stage]
