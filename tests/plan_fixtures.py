"""Small layouts and models for planner tests (pure Python; independent of the framework layouts)."""

from __future__ import annotations

from reshardctl.layout.placement import Placement, ShardTemplate
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelDims, ModelSpec, TensorSpec


def chunk_bounds(n: int, k: int, i: int) -> tuple[int, int]:
    c = -(-n // k)
    return min(i * c, n), min((i + 1) * c, n)


def toy_model(shapes: list[tuple[int, ...]], roles: list[str] | None = None, dtype: str = "bfloat16") -> ModelSpec:
    roles = roles or ["ffn"] * len(shapes)
    tensors = tuple(
        TensorSpec(f"t{i}.weight", tuple(s), dtype, roles[i], "mlp_up", layer=i) for i, s in enumerate(shapes)
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
        return f"split shards={self.shards} replicas={self.replicas} dims={self.dims} stages={self.stages}"

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
