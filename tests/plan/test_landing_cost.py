"""The cost model's ``landing`` term (docs/cost-model.md "Landing"): its arithmetic, the per-rank counts
it is charged on (checked against the layouts' own parameters), the profile keys that set its constants,
and ``reshardctl plan`` showing it with the loader path's extra."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.api import plan_refit
from reshardctl.cli import main
from reshardctl.errors import ProfileError
from reshardctl.layout.placement import box_numel
from reshardctl.plan.cost import TERMS, Links, landing_seconds, predict
from reshardctl.plan.stats import landing_counts
from reshardctl.site import load_profile
from reshardctl.site.parse import parse_profile

SETTINGS = dict(deadline=None, derandomize=True, max_examples=60)
GPU = Links(nvlink=380e9, nic=47e9, node_nic=376e9, nvlink_latency=2e-6, nic_latency=5e-6, launch=2e-6,
            copy=1000e9, checksum=500e9, msg_concurrency=8, nics_per_node=8, land_param=1.5e-6, loader_call=20e-6)
counts = st.integers(0, 10**6)
rates = st.floats(1e-9, 1e-3)


@settings(**SETTINGS)
@given(v=counts, t=counts, b=st.integers(0, 1 << 40), dv=counts, dt=counts, db=st.integers(0, 1 << 40),
       per_param=rates, per_call=rates, copy=st.floats(1e6, 1e13))
def test_landing_is_monotone_additive_and_zero_when_empty(v, t, b, dv, dt, db, per_param, per_call, copy):
    links = replace(GPU, land_param=per_param, loader_call=per_call, copy=copy)
    d0, l0 = landing_seconds(v, t, b, links)
    d1, l1 = landing_seconds(v + dv, t + dt, b + db, links)
    assert d1 >= d0 and l1 >= l0  # more segments, tensors or bytes never land faster
    if dv or db:
        assert d1 > d0
    if dt or db:
        assert l1 > l0
    # additive: two disjoint sets of parameters land in the sum of their times
    dd, ll = landing_seconds(dv, dt, db, links)
    assert math.isclose(d1, d0 + dd, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(l1, l0 + ll, rel_tol=1e-9, abs_tol=1e-15)
    assert landing_seconds(0, 0, 0, links) == (0.0, 0.0)


@pytest.mark.parametrize("model,infer", [
    ("tiny-llama", "tp=2"),
    ("tiny-qwen3-moe", "tp=2"),
    ("tiny-qwen3-moe", "tp=2,ep=2"),  # expert stacks in local expert order
    ("tiny-deepseek", "tp=2"),  # MLA fused params
])
def test_counts_are_what_each_inference_rank_lands(model, infer):
    """Per inference rank: the segments of its framework parameters (what a binding lands with one
    ``_foreach_copy_``), the HF tensors it holds a part of (a loader's calls), their bytes."""
    plan = plan_refit(model=model, train="tp=2", infer=infer)
    c = landing_counts(plan)
    assert c.views.shape == (plan.infer_world,)
    sizes = {t.name: t.itemsize for t in plan.model.tensors}
    for r in range(plan.infer_world):
        held = plan.dst_holdings(r)
        segs = [s for lp in plan.infer.local_params(r) for s in lp.segments]
        assert c.views[r] == sum(len(b) for b in held.values()) == len(segs)
        assert c.tensors[r] == sum(1 for b in held.values() if b) == len({s.hf_name for s in segs})
        assert c.nbytes[r] == sum(box_numel(s.box) * sizes[s.hf_name] for s in segs)
        assert c.nbytes[r] > 0


def test_predict_charges_the_busiest_inference_rank_and_reports_the_loader_extra():
    plan = plan_refit(model="tiny-qwen3-moe", train="tp=2", infer="tp=2,ep=2")
    pred = predict(plan, GPU)
    ld = pred.landing
    assert set(pred.breakdown) == set(TERMS) and "landing" in TERMS
    assert math.isclose(sum(pred.breakdown.values()), pred.predicted_s, rel_tol=1e-12)
    c = landing_counts(plan)
    direct, loader = landing_seconds(c.views, c.tensors, c.nbytes, GPU)
    assert pred.breakdown["landing"] == ld["seconds"] == direct.max() > 0
    assert ld["params"] == c.views[ld["infer_rank"]] and ld["bytes"] == c.nbytes[ld["infer_rank"]]
    assert math.isclose(ld["loader_extra_s"], loader.max() - direct.max())
    # without the host costs only the copy remains; the other terms do not move
    free = predict(plan, replace(GPU, land_param=0.0, loader_call=0.0))
    assert free.breakdown["landing"] == c.nbytes.max() / GPU.copy
    assert {k: v for k, v in free.breakdown.items() if k != "landing"} == \
        {k: v for k, v in pred.breakdown.items() if k != "landing"}
    # reshardctl run's ranks commit by swapping their arena: no landing charged, still reported
    swap = predict(plan, GPU, land=False)
    assert swap.breakdown["landing"] == 0 and swap.landing == pred.landing
    assert math.isclose(swap.predicted_s, pred.predicted_s - ld["seconds"], rel_tol=1e-12)
    slow = predict(plan, replace(GPU, land_param=1e-3))
    assert slow.breakdown["landing"] > pred.breakdown["landing"] and slow.predicted_s > pred.predicted_s


def test_cpu_only_landing_is_at_least_every_rank_over_the_cores():
    plan = plan_refit(model="tiny-llama", train="tp=2", infer="tp=2")
    c = landing_counts(plan)
    one_core = Links.from_site(load_profile("local"), cores=1)
    got = predict(plan, one_core).breakdown["landing"]
    assert got >= c.views.sum() * one_core.land_param + c.nbytes.sum() / one_core.copy_all - 1e-15
    assert got > landing_seconds(c.views, c.tensors, c.nbytes, one_core)[0].max()


def test_profile_keys_set_the_constants():
    base = {"nodes": 2, "gpus_per_node": 4, "links": {"nvlink_gbytes_per_s": 450, "nic_gbits_per_s": 400}}
    p = parse_profile({**base, "links": {**base["links"], "landing_us_per_param": 0.5, "loader_us_per_tensor": 40}},
                      "p.yaml")
    links = Links.from_site(p)
    assert math.isclose(links.land_param, 0.5e-6) and math.isclose(links.loader_call, 40e-6)
    d = parse_profile(base, "p.yaml").links  # the defaults: measured on this machine (docs/cost-model.md)
    assert d.landing_us_per_param > 0 and d.loader_us_per_tensor > d.landing_us_per_param


@pytest.mark.parametrize("key,value,expect", [
    ("landing_us_per_param", -1, "links.landing_us_per_param"),
    ("loader_us_per_tensor", "fast", "links.loader_us_per_tensor"),
    ("loader_us_per_tensor", True, "links.loader_us_per_tensor"),
    ("landing_us_per_param", 1e300, "links.landing_us_per_param"),
])
def test_bad_landing_keys_name_file_and_key(tmp_path, capsys, key, value, expect):
    base = {"nodes": 2, "gpus_per_node": 4, "links": {"nvlink_gbytes_per_s": 450, "nic_gbits_per_s": 400, key: value}}
    with pytest.raises(ProfileError, match=expect):
        parse_profile(base, "p.yaml")
    f = tmp_path / "bad.yaml"  # JSON is YAML
    f.write_text(json.dumps({"site": "bad", **base}))
    code = main(["profile", "validate", str(f)])
    out, err = capsys.readouterr()
    assert code == 2 and expect in out + err and str(f) in out + err and "Traceback" not in out + err


def test_plan_shows_the_term_and_the_loader_extra(capsys):
    argv = ["plan", "--site", "local", "--model", "tiny-qwen3-moe", "--train", "tp=2", "--infer", "tp=2,ep=2"]
    assert main(argv + ["--json", "--transport", "all"]) == 0
    res = json.loads(capsys.readouterr()[0])
    rows = res["transports"]
    for row in rows.values():
        assert row["predicted_breakdown_s"]["landing"] == row["landing"]["seconds"] > 0
        assert set(row["landing"]) >= {"params", "tensors", "bytes", "loader_s", "loader_extra_s", "infer_rank"}
    # the inference layout's: the same on every transport
    assert len({json.dumps(r["landing"], sort_keys=True) for r in rows.values()}) == 1
    ld = next(iter(rows.values()))["landing"]
    assert ld["loader_extra_s"] > 0
    assert main(argv) == 0
    out = capsys.readouterr()[0]
    assert "landing" in out and f"{ld['params']:,} parameter segments" in out and "a framework loader" in out
    assert "would add" in out
    np.testing.assert_array_equal(sorted(rows), sorted(["reshard", "gather_broadcast", "hybrid"]))


def test_run_predicts_without_landing_and_plan_with_it(tmp_path):
    """``reshardctl run``'s ranks commit by swapping their arena (nothing lands): its summary's prediction
    charges no landing; ``plan``'s (a refit in an RL job) does, by the same figure."""
    from reshardctl.plan_report import plan_report
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare
    from reshardctl.runs.session import plan_transports, session_context

    inp = prepare(RefitRequest(model="tiny-llama", train="tp=2", infer="tp=2"))
    plans = plan_transports(inp, ["reshard"])
    ctx = session_context(inp, plans, iterations=1, warmup=0, launcher="local", run_dir=tmp_path, command="run")
    run_row = ctx["transports"]["reshard"]
    plan_row = plan_report(inp)[1]["transports"]["reshard"]
    assert run_row["predicted_breakdown_s"]["landing"] == 0
    assert plan_row["predicted_breakdown_s"]["landing"] > 0
    assert math.isclose(plan_row["predicted_s"] - run_row["predicted_s"], plan_row["landing"]["seconds"], rel_tol=1e-9)
