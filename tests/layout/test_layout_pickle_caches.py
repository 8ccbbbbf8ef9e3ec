"""A pickled layout (a session file's) leaves out what the planner kept with it for one command
(``side.PLANNING_CACHES``: the template pairs' pieces are keyed by the templates' ids, which a copy does
not keep) and keeps everything else; plans rebuilt from the copy are the same."""

from __future__ import annotations

import pickle

from reshardctl.layout.build import build_layout
from reshardctl.layout.side import PLANNING_CACHES
from reshardctl.models import load_model
from reshardctl.plan.planner import build_plan
from reshardctl.plan.stats import p2p_stats
from reshardctl.topology import Topology


def test_a_pickled_layout_drops_the_planning_caches_and_plans_the_same():
    model = load_model("tiny-qwen3-moe")
    train = build_layout(model, "train", "tp=2,ep=2,etp=1")
    infer = build_layout(model, "infer", "tp=2,dp=2")
    topo = Topology(train.world_size, infer.world_size, 8, 1)
    plan = build_plan(model, train, infer, topo, transport="reshard", relay=True)
    p2p_stats(plan)  # fills _class_boxes
    infer.local_params(0)  # fills _local_params
    infer.param_names(0)  # fills _param_names
    assert set(PLANNING_CACHES) <= set(train.__dict__) | set(infer.__dict__)
    copy = pickle.loads(pickle.dumps(plan))
    for before, after in ((plan.train, copy.train), (plan.infer, copy.infer)):
        assert not set(PLANNING_CACHES) & set(after.__dict__)
        assert set(after.__dict__) == set(before.__dict__) - set(PLANNING_CACHES)
    again = build_plan(model, copy.train, copy.infer, copy.topology, transport="reshard", relay=True)
    assert again.fingerprint == plan.fingerprint
    assert copy.infer.local_params(0) == infer.local_params(0)  # rebuilt from the copy, the same
    assert copy.infer.param_names(0) == infer.param_names(0)
