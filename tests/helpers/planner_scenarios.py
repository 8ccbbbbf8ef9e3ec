"""Random planning scenarios (toy model, two layouts, topology, bucket) for the planner's property tests."""

from __future__ import annotations

import os

from hypothesis import HealthCheck
from hypothesis import strategies as st

from helpers.plan_fixtures import SplitLayout, toy_model
from reshardctl.plan.planner import build_plan
from reshardctl.topology import Topology


# RESHARDCTL_PROPERTY_SCALE=20 multiplies the examples and draws fresh random ones (soak runs);
# the default is small, fixed (derandomized) and fast.
SCALE = int(os.environ.get("RESHARDCTL_PROPERTY_SCALE", "1"))
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=SCALE == 1)
ROLES = ("ffn", "expert", "norm", "attention")
DTYPES = ("bfloat16", "float32", "int8")


@st.composite
def layouts(draw, model, side, max_world):
    stages = draw(st.integers(1, 2))
    shards = draw(st.integers(1, 4))
    replicas = draw(st.integers(1, 3))
    while shards * replicas * stages > max_world:
        replicas = max(1, replicas - 1) if replicas > 1 else replicas
        if shards * replicas * stages > max_world:
            shards = max(1, shards - 1)
    dims = tuple(draw(st.lists(st.integers(0, 2), min_size=1, max_size=3)))
    world = shards * replicas * stages
    perm = draw(st.permutations(range(world))) if draw(st.booleans()) else None
    return SplitLayout(model, side, shards, replicas=replicas, dims=dims, perm=perm, stages=stages)


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 4))
    shapes = [tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))) for _ in range(n)]
    roles = [draw(st.sampled_from(ROLES)) for _ in range(n)]
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(n)]
    model = toy_model(shapes, roles, dtypes)
    train = draw(layouts(model, "train", 8))
    infer = draw(layouts(model, "infer", 12))
    topo = Topology(train.world_size, infer.world_size, draw(st.integers(1, 4)), draw(st.integers(1, 3)))
    # tiny buckets force splitting (>= 4 bytes: one float32 element must fit)
    bucket = draw(st.one_of(st.integers(4, 64), st.sampled_from([100, 1000, 1 << 20])))
    return model, train, infer, topo, bucket


def scenario_plan(s, transport="reshard", relay=False, **kw):
    model, train, infer, topo, bucket = s
    return build_plan(model, kw.get("train", train), kw.get("infer", infer), topo,
                      transport=transport, bucket_bytes=kw.get("bucket", bucket), relay=relay)
