"""Small pure helpers shared by the Megatron and vLLM layouts: 1-D splits, template interning,
derived fp8 block-scale templates, arithmetic in messages, and ``StagedPlacements``
(the pipeline-stage and placement-cache methods both layouts have)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from reshardctl.layout.placement import Box, Placement, ShardTemplate, full_box
from reshardctl.models.spec import KINDS

_SCALE_KIND = KINDS.index("scale_inv")

SCALE_BLOCK = 128  # DeepSeek fp8 weight_block_size


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def frac(a: int, b: int) -> str:
    """``64/3 = 21.33`` style arithmetic for messages."""
    q = a / b
    return f"{a}/{b} = {q:.2f}".rstrip("0").rstrip(".") if q != int(q) else f"{a}/{b} = {int(q)}"


def need_divides(problems: list[str], d: int, n: int, what: str, name: str) -> bool:
    """Append ``"{what} does not divide {name}={n} (n/d = x)"`` unless d divides n."""
    if d <= 0 or n % d:
        problems.append(f"{what} does not divide {name}={n} ({frac(n, d)})")
        return False
    return True


def span_boxes(shape: tuple[int, ...], dim: int, start: int, end: int) -> tuple[Box, ...]:
    """One box selecting ``[start, end)`` along ``dim`` (clipped to the shape); empty tuple if empty."""
    end = min(end, shape[dim])
    if end <= start:
        return ()
    box = list(full_box(shape))
    box[dim] = (start, end)
    return (tuple(box),)


def split_template(
    shape: tuple[int, ...], dim: int, n: int, slot_index: Sequence[int | None], per: int | None = None,
    limit: int | None = None,
) -> ShardTemplate:
    """Contiguous split of ``dim`` into ``n`` pieces of ``per`` (default ``shape[dim]//n``) rows; slot ``s``
    holds piece ``slot_index[s]`` (None = nothing). ``limit`` clips (real rows of a padded vocab)."""
    per = shape[dim] // n if per is None else per
    lim = shape[dim] if limit is None else min(limit, shape[dim])
    pieces = [span_boxes(shape, dim, k * per, min((k + 1) * per, lim)) for k in range(n)]
    return ShardTemplate(shape, tuple(() if k is None else pieces[k] for k in slot_index))


def replicated_template(shape: tuple[int, ...], slots: int) -> ShardTemplate:
    return ShardTemplate(shape, (((full_box(shape)),),) * slots)


def scale_template(weight: ShardTemplate, scale_shape: tuple[int, ...], block: int = SCALE_BLOCK) -> ShardTemplate:
    """The fp8 ``weight_scale_inv`` split that follows a weight's split at ``block`` granularity.

    Exact when every weight box edge is block-aligned (or at the weight's end); otherwise every slot
    holding any part of the weight holds the whole scale tensor (a replica), so coverage stays exact.
    """
    nd = len(scale_shape)
    wshape = weight.shape[-nd:] if len(weight.shape) >= nd else weight.shape
    aligned = True
    for holding in weight.holdings:
        for box in holding:
            for d, (a, b) in enumerate(box[-nd:]):
                if a % block or (b % block and b != wshape[d]):
                    aligned = False
    out = []
    for holding in weight.holdings:
        if not holding:
            out.append(())
        elif aligned:
            out.append(tuple(tuple((a // block, min(ceil_div(b, block), scale_shape[d])) for d, (a, b)
                                   in enumerate(box[-nd:])) for box in holding))
        else:
            out.append((full_box(scale_shape),))
    return ShardTemplate(scale_shape, tuple(out))


class Interner:
    """Dict cache: ``get(key, build)`` returns the one object built for ``key``."""

    __slots__ = ("_d",)

    def __init__(self) -> None:
        self._d: dict = {}

    def get(self, key, build: Callable[[], object]):
        v = self._d.get(key)
        if v is None:
            v = build()
            self._d[key] = v
        return v

    def __len__(self) -> int:
        return len(self._d)


class StagedPlacements:
    """Mixin (before ``SideLayout`` in the bases) for a layout whose ranks are split into ``pp``
    pipeline stages: a layer's tensors live on its stage, the embedding on the first stage, every other
    non-layer tensor on the last; a placement is built once per tensor index, an fp8 block scale
    (``scale_inv``) is placed like the weight it scales and any other tensor by the layout's
    ``_tensor_placement(tensor, stage)``.

    The layout sets ``model``, ``pp``, ``_layer_stage`` (global layer -> stage), ``_stage_ranks``
    (stage -> ranks), ``_templates`` and ``_placements`` (``Interner``) and ``_by_index``
    (``[None] * len(model.tensors)``), and implements ``_tensor_placement``."""

    def num_stages(self) -> int:
        return self.pp

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        return self._stage_ranks[stage]

    def stage_of(self, index: int) -> int:
        t = self.model.tensors[index]
        if t.layer is not None:
            return self._layer_stage[t.layer]
        return 0 if t.kind == "embed" else self.pp - 1

    def stage_array(self) -> np.ndarray:
        """``stage_of`` of every tensor as an int64 array, from the model's layer and kind columns (one
        numpy pass, not a call per tensor); computed once."""
        cached = self.__dict__.get("_stage_array")
        if cached is None:
            layer = self.model.layer_array
            size = max([int(layer.max()) + 1 if layer.size else 0, *(g + 1 for g in self._layer_stage)])
            lut = np.full(max(size, 1), -1, dtype=np.int64)
            lut[list(self._layer_stage)] = list(self._layer_stage.values())
            unplaced = (layer >= 0) & (lut[np.maximum(layer, 0)] < 0)
            if unplaced.any():  # a layer the layout does not place: stage_of's lookup would raise the same
                raise KeyError(int(layer[np.argmax(unplaced)]))
            no_layer = np.where(self.model.kind_array == "embed", 0, self.pp - 1)
            cached = self.__dict__["_stage_array"] = np.where(layer >= 0, lut[np.maximum(layer, 0)], no_layer)
        return cached

    def placement_classes(self) -> tuple[np.ndarray, list[Placement]]:
        """``SideLayout.placement_classes`` (the same classes, numbers and representatives), from the
        layout's placement keys (``_placement_keys``: per tensor a number, equal where ``placement``
        returns the same object): ``placement`` once per distinct key, not once per tensor (DeepSeek-V3:
        45,395 tensors, a few hundred keys). The walk per tensor where the layout has no keys."""
        cached = self.__dict__.get("_placement_classes")
        if cached is not None:
            return cached
        scales = (self.model.kind_codes == _SCALE_KIND).any()  # each placed like its weight: the walk
        keys = None if scales else self._placement_keys()
        if keys is None:
            return super().placement_classes()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        number = np.empty(first.size, dtype=np.int64)  # per key, its class
        by_key: dict[tuple, int] = {}
        reps: list[Placement] = []
        for u in np.argsort(first, kind="stable").tolist():  # keys in model order of first appearance
            p = self.placement(int(first[u]))
            k = by_key.get((id(p.template), p.ranks))
            if k is None:
                k = by_key[(id(p.template), p.ranks)] = len(reps)
                reps.append(p)
            number[u] = k
        cached = self.__dict__["_placement_classes"] = (number[inverse.reshape(-1)], reps)
        return cached

    def _placement_keys(self) -> np.ndarray | None:
        """Per tensor, a number that is equal for two tensors only where ``placement`` returns the same
        object for both; None: none (``placement_classes`` walks the tensors). A layout's
        ``_tensor_placement`` interns its placements by a key; these are that key's fields, numbered."""
        return None

    @staticmethod
    def _combined(*columns: np.ndarray) -> np.ndarray | None:
        """One int64 number per row of non-negative integer ``columns``, distinct for distinct rows (mixed
        radix), or None where the radices' product would pass 2**62."""
        out = np.zeros(len(columns[0]), dtype=np.int64)
        span = 1
        for c in columns:
            c = np.asarray(c, dtype=np.int64)
            radix = int(c.max(initial=0)) + 1
            span *= radix
            if span >= 1 << 62 or (c.size and int(c.min()) < 0):
                return None
            out = out * radix + c
        return out

    def placement(self, index: int) -> Placement:
        p = self._by_index[index]
        if p is None:
            t = self.model.tensors[index]
            if t.kind == "scale_inv":
                p = self._scale_placement(t)
            else:
                p = self._tensor_placement(t, self.stage_of(index))
            self._by_index[index] = p
        return p

    def _scale_placement(self, t) -> Placement:
        w = self.placement(self.model.index(t.scale_of))
        tmpl = self._templates.get(("scale", id(w.template), t.shape),
                                   lambda: scale_template(w.template, t.shape))
        return self._placements.get(("scale", id(tmpl), w.ranks), lambda: Placement(tmpl, w.ranks))

