"""Where each global rank sits: node and NVLink domain. Pure; built from the site profile.

Trainer ranks fill nodes first (global ranks ``0..T-1``); the inference allocation starts on the next
node (global ranks ``T..T+I-1``): the two pools are separate allocations, as in disaggregated RL.
Nodes are grouped into NVLink domains of ``nodes_per_domain`` consecutive nodes (1 on DGX H100,
18 on GB200 NVL72), so a trainer and an inference node can share a domain only on multi-node NVLink.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reshardctl.errors import LayoutError


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- global <-> side ranks: the one home of this arithmetic ----------------------------------------
# Global ranks 0..T-1 are the trainer ranks, T..T+I-1 the inference ranks (T = train_world). The
# functions work on ints and, elementwise, on numpy arrays of ranks.


def is_trainer(global_rank, train_world: int):
    """True where ``global_rank`` is a trainer rank."""
    return global_rank < train_world


def infer_global(infer_rank, train_world: int):
    """The global rank of inference rank ``infer_rank``."""
    return train_world + infer_rank


def infer_rank_of(global_rank, train_world: int):
    """The inference rank of global rank ``global_rank`` (which must be an inference rank)."""
    return global_rank - train_world


def global_of(side: str, side_rank: int, train_world: int) -> int:
    """The global rank of rank ``side_rank`` of ``side`` (``"train"`` or ``"infer"``)."""
    return side_rank if side == "train" else infer_global(side_rank, train_world)


def train_world_of(global_rank: int, infer_rank: int) -> int:
    """The trainer world size, from an inference rank's global rank and inference rank."""
    return global_rank - infer_rank


def side_of_global(global_rank: int, train_world: int) -> tuple[str, int]:
    """``(side, side_rank)`` of a global rank: ``("train", r)`` or ``("infer", r)``."""
    if is_trainer(global_rank, train_world):
        return "train", global_rank
    return "infer", infer_rank_of(global_rank, train_world)


@dataclass(frozen=True)
class Topology:
    train_world: int
    infer_world: int
    gpus_per_node: int
    nodes_per_domain: int
    num_nodes_available: int | None = None  # the site's node count (None: unbounded)
    node_of: np.ndarray = field(init=False, repr=False, compare=False)
    domain_of: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        for key in ("train_world", "infer_world", "gpus_per_node", "nodes_per_domain"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be >= 1 (got {getattr(self, key)})")
        if problems:
            raise LayoutError(problems)
        tn, inn = self.train_nodes, self.infer_nodes
        if self.num_nodes_available is not None and tn + inn > self.num_nodes_available:
            g = self.gpus_per_node
            raise LayoutError(
                f"trainer ranks ({self.train_world}) need ceil({self.train_world}/{g}) = {tn} node(s) and "
                f"inference ranks ({self.infer_world}) need ceil({self.infer_world}/{g}) = {inn} node(s): "
                f"{tn} + {inn} = {tn + inn} nodes, but the site has {self.num_nodes_available}"
            )
        g = self.gpus_per_node
        train_nodes = np.arange(self.train_world) // g
        infer_nodes = tn + np.arange(self.infer_world) // g
        node_of = np.concatenate([train_nodes, infer_nodes]).astype(np.int32)
        object.__setattr__(self, "node_of", node_of)
        object.__setattr__(self, "domain_of", (node_of // self.nodes_per_domain).astype(np.int32))

    @classmethod
    def from_site(cls, site, train_world: int, infer_world: int) -> "Topology":
        return cls(
            train_world=train_world,
            infer_world=infer_world,
            gpus_per_node=site.gpus_per_node,
            nodes_per_domain=site.nvlink_domain_nodes,
            num_nodes_available=site.num_nodes,
        )

    @property
    def world(self) -> int:
        return self.train_world + self.infer_world

    @property
    def train_nodes(self) -> int:
        return _ceil_div(self.train_world, self.gpus_per_node)

    @property
    def infer_nodes(self) -> int:
        return _ceil_div(self.infer_world, self.gpus_per_node)

    def infer_global(self, infer_rank):
        return infer_global(infer_rank, self.train_world)

    def side_of_global(self, global_rank: int) -> tuple[str, int]:
        return side_of_global(global_rank, self.train_world)

    def describe(self) -> dict:
        return {
            "train_world": self.train_world,
            "infer_world": self.infer_world,
            "gpus_per_node": self.gpus_per_node,
            "nodes_per_domain": self.nodes_per_domain,
            "train_nodes": self.train_nodes,
            "infer_nodes": self.infer_nodes,
        }
