"""Small layouts and models for planner tests (pure Python; independent of the framework layouts)."""

from __future__ import annotations

from reshardctl.layout.placement import Placement, ShardTemplate
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelDims, ModelSpec, TensorSpec


def chunk_bounds(n: int, k: int, i: int) -> tuple[int, int]:
    c = -(-n // k)
    return min(i * c, n), min((i + 1) * c, n)


def toy_model(
    shapes: list[tuple[int, ...]], roles: list[str] | None = None, dtype: str | list[str] = "bfloat16"
) -> ModelSpec:
    """``dtype``: one dtype for every tensor, or one per tensor."""
    roles = roles or ["ffn"] * len(shapes)
    dtypes = [dtype] * len(shapes) if isinstance(dtype, str) else list(dtype)
    tensors = tuple(
        TensorSpec(f"t{i}.weight", tuple(s), dtypes[i], roles[i], "mlp_up", layer=i) for i, s in enumerate(shapes)
    )
    dims = ModelDims("toy", 8, len(shapes), 1, 1, 8, 8, 8)
    return ModelSpec("toy", dims, tensors)


class SplitLayout(SideLayout):
    """Every tensor split along ``dim`` into ``shards`` torch.chunk pieces, each held by ``replicas``
    ranks; rank = replica * shards + shard, permuted by ``perm`` if given; tensor i's dim is
    ``dims[i % len(dims)]``."""

    def __init__(self, model, side, shards, replicas=1, dims=(0,), perm=None, stages=1):
        self.model, self.side = model, side
        self.shards, self.replicas, self.dims, self.stages = shards, replicas, tuple(dims), stages
        self.world_size = shards * replicas * stages
        self.perm = list(perm) if perm is not None else list(range(self.world_size))
        self._cache = {}

    def describe(self) -> str:
        return (
            f"split shards={self.shards} replicas={self.replicas} dims={self.dims} stages={self.stages}"
            f" perm={self.perm}"
        )

    def num_stages(self):
        return self.stages

    def stage_of(self, i):
        return i % self.stages

    def stage_ranks(self, s):
        per = self.shards * self.replicas
        return tuple(self.perm[s * per + j] for j in range(per))

    def placement(self, i):
        t = self.model.tensors[i]
        d = self.dims[i % len(self.dims)] % len(t.shape)
        s = self.stage_of(i)
        key = (t.shape, d, s)
        if key not in self._cache:
            holdings, ranks = [], []
            for r in range(self.replicas):
                for k in range(self.shards):
                    a, b = chunk_bounds(t.shape[d], self.shards, k)
                    box = tuple((a, b) if j == d else (0, n) for j, n in enumerate(t.shape))
                    holdings.append((box,) if a < b else ())
                    ranks.append(self.perm[s * self.shards * self.replicas + r * self.shards + k])
            self._cache[key] = Placement(ShardTemplate(t.shape, tuple(holdings)), tuple(ranks))
        return self._cache[key]


class BoxLayout(SideLayout):
    """Explicit placements: ``holdings[i]`` is a list of (rank, boxes) pairs for tensor i (one slot
    each; a tensor may leave ranks out or leave elements uncovered, for error cases)."""

    def __init__(self, model, side, world_size, holdings, stages=None):
        self.model, self.side, self.world_size = model, side, world_size
        self._holdings = [list(h) for h in holdings]
        self._stages = stages  # per tensor stage index, or None (one stage)
        self._placements = [
            Placement(ShardTemplate(t.shape, tuple(tuple(b) for _, b in h)), tuple(r for r, _ in h))
            for t, h in zip(model.tensors, self._holdings)
        ]

    def describe(self) -> str:
        return f"boxes {self._holdings!r}"

    def placement(self, i):
        return self._placements[i]

    def num_stages(self):
        return 1 if self._stages is None else max(self._stages) + 1

    def stage_of(self, i):
        return 0 if self._stages is None else self._stages[i]

    def stage_ranks(self, s):
        if self._stages is None:
            return tuple(range(self.world_size))
        return tuple(sorted({r for i, h in enumerate(self._holdings) if self._stages[i] == s for r, _ in h}))


def stage_phases(plan, stage: int) -> int:
    """How many phases the planner spread ``stage`` of ``plan`` over (1: packed first fit), recomputed
    from the plan's units as ``plan/reshard.py`` ``schedule_rounds`` does."""
    import numpy as np

    from reshardctl.plan.reshard import phases_of_stage

    us = [u for u in plan.units if u.stage == stage]
    if not us:
        return 1
    return phases_of_stage(np.concatenate([u.table.src for u in us]), np.concatenate([u.table.dst for u in us]),
                           np.concatenate([u.table.nbytes * len(u.tensors) for u in us]).astype(np.float64),
                           plan.world, plan.bucket_bytes)[0]


def stage_transfers(plan, stage: int):
    """Every (round index, sender, receiver) of a transfer row scheduled in ``stage`` of ``plan``."""
    for rnd in plan.rounds:
        if rnd.stage != stage:
            continue
        for e in rnd.records():
            t = plan.units[e.unit].table
            for s, d in zip(t.src[e.t_lo:e.t_hi].tolist(), t.dst[e.t_lo:e.t_hi].tolist()):
                yield rnd.index, s, d
