"""Batched routing (``route_many``: many instances of one pieces object at once) equals routing each
instance alone (tests/helpers/routing_reference.py): sources, stages, relays, bytes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.routing_reference import reference_route
from helpers.planner_scenarios import SCALE, SETTINGS, scenarios
from reshardctl.plan.pairs import intersect_templates
from reshardctl.plan.reshard import group_tensors
from reshardctl.plan.routing import route_many


def _same_tables(a, b) -> None:
    for f in ("src", "dst", "stage", "lo", "hi", "nbytes"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f


def _check(model, train, infer, topo, relay, rotations, perm_seed) -> None:
    T = topo.train_world
    for sp, dp, members in group_tensors(model, train, infer, None):
        pieces = intersect_templates(sp.template, dp.template)
        itemsize = model.tensors[members[0]].itemsize
        src = np.asarray(sp.ranks, dtype=np.int32)
        dst = np.asarray(dp.ranks, dtype=np.int32) + T
        # instances on permuted source / destination ranks, as other groups of the same templates have
        rng = np.random.default_rng(perm_seed)
        srcs = [src] + [rng.permutation(src) for _ in rotations[1:]]
        dsts = [dst] + [rng.permutation(dst) for _ in rotations[1:]]
        got = route_many(pieces, np.stack(srcs), np.stack(dsts), topo, np.full(len(rotations), itemsize),
                         np.asarray(rotations), relay=relay)
        for k, rot in enumerate(rotations):
            _same_tables(got[k], reference_route(pieces, srcs[k], dsts[k], topo, itemsize, rotation=rot, relay=relay))


@settings(max_examples=80 * SCALE, **SETTINGS)
@given(s=scenarios(), relay=st.booleans(), rotations=st.lists(st.integers(0, 50), min_size=1, max_size=5),
       seed=st.integers(0, 1000))
def test_route_many_equals_one_instance_at_a_time(s, relay, rotations, seed):
    model, train, infer, topo, _ = s
    _check(model, train, infer, topo, relay, rotations, seed)


def test_route_many_on_framework_layouts():
    from reshardctl.layout.build import build_layout
    from reshardctl.models import load_model
    from reshardctl.topology import Topology

    model = load_model("deepseek-v3", layers=4)
    for tspec, ispec in (("pp=2,ep=4", "tp=8,dp=2"), ("tp=2,pp=2,dp=2", "tp=4,dp=4")):
        train, infer = build_layout(model, "train", tspec), build_layout(model, "infer", ispec)
        topo = Topology(train.world_size, infer.world_size, 4, 1)
        for relay in (False, True):
            _check(model, train, infer, topo, relay, [0, 1, 2, 7], 0)
