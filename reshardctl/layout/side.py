"""The interface every trainer or inference layout implements (Megatron, vLLM, DTensor, generic file).

The planner only calls ``placement`` and the pipeline methods; ``local_params`` is for the runtime's
framework-faithful storage and for ``reshardctl layout show``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import numpy as np

from reshardctl.layout.placement import LocalParam, LocalSegment, Placement, box_shape
from reshardctl.models.spec import ModelSpec

Side = Literal["train", "infer"]


# What the planner keeps with a layout for the plans of one command, left out of a pickled layout (a
# session file): the template pairs' pieces (``plan/reshard.py``, keyed by the templates' ids, which a
# copy does not keep) and every rank's box per placement class (``plan/stats.py``, megabytes a rank never
# reads), and a vLLM rank's parameter list (``layout/vllm.py`` ``local_params``: the cost model's count
# and the bindings read it) and its parameter names (the cost model's count). Rebuilt where they are needed.
PLANNING_CACHES = ("_pair_pieces", "_class_boxes", "_local_params", "_param_names")


class SideLayout(ABC):
    """One side's layout of a whole model. Immutable after construction; validated on construction
    (raise ``LayoutError`` with every violation listed)."""

    side: Side
    model: ModelSpec
    world_size: int

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in PLANNING_CACHES}

    @abstractmethod
    def describe(self) -> str:
        """Short human form, e.g. ``megatron tp=4,pp=2,dp=1``."""

    @abstractmethod
    def placement(self, index: int) -> Placement:
        """Placement of ``model.tensors[index]``. Must be cheap and return interned templates: it is
        called once per tensor (90k tensors for DeepSeek-V3)."""

    def placement_classes(self) -> tuple[np.ndarray, list[Placement]]:
        """Per tensor, the class of its placement (classes: same template object and same ranks,
        numbered in model order of first appearance), and one placement per class. Computed once
        (the layout is immutable); the representatives keep the template ids stable."""
        cached = self.__dict__.get("_placement_classes")
        if cached is None:
            by_id: dict[int, int] = {}
            by_key: dict[tuple, int] = {}
            reps: list[Placement] = []
            keep: list[Placement] = []
            placement, by_id_get = self.placement, by_id.get  # (hot: once per tensor)
            classes: list[int] = []
            for i in range(len(self.model.tensors)):
                p = placement(i)
                k = by_id_get(id(p))
                if k is None:
                    key = (id(p.template), p.ranks)
                    k = by_key.get(key)
                    if k is None:
                        k = by_key[key] = len(reps)
                        reps.append(p)
                    by_id[id(p)] = k
                    keep.append(p)  # alive while keyed by id
                classes.append(k)
            cached = self.__dict__["_placement_classes"] = (np.asarray(classes, dtype=np.int64), reps)
        return cached

    def stage_array(self) -> np.ndarray:
        """``stage_of`` of every tensor, as an int64 array (computed once)."""
        cached = self.__dict__.get("_stage_array")
        if cached is None:
            cached = self.__dict__["_stage_array"] = np.fromiter(
                (self.stage_of(i) for i in range(len(self.model.tensors))), dtype=np.int64,
                count=len(self.model.tensors))
        return cached

    # Pipeline structure (gather-and-broadcast gathers per stage). Default: a single stage.
    def num_stages(self) -> int:
        return 1

    def stage_of(self, index: int) -> int:
        return 0

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        return tuple(range(self.world_size))

    def local_params(self, rank: int) -> list[LocalParam]:
        """Framework parameters on ``rank`` with their segments. Default: one unfused parameter per
        (tensor, box), named ``<hf_name>#<k>`` (``<hf_name>`` when the rank holds one box)."""
        out: list[LocalParam] = []
        for i, t in enumerate(self.model.tensors):
            boxes = self.placement(i).holding(rank)
            for k, box in enumerate(boxes):
                pname = t.name if len(boxes) == 1 else f"{t.name}#{k}"
                seg = LocalSegment(t.name, box, pname, (0,) * len(t.shape))
                out.append(LocalParam(pname, box_shape(box), t.dtype, (seg,)))
        return out
