"""``reshardctl/calibrate/landing.py``: the two landing paths the cost model's constants are measured on
(benchmarks/landing.py, the calibration's ``host_cost``) write the same bytes into real vLLM-shaped
parameters (fused qkv / gate_up, expert stacks, MLA, padded vocab), each segment from its HF tensor's box."""

from __future__ import annotations

import pytest
import torch

from reshardctl.api import plan_refit
from reshardctl.calibrate.landing import build, host_cost, land_direct, land_loader


@pytest.mark.parametrize("model,infer", [("tiny-llama", "tp=2"), ("tiny-qwen3-moe", "tp=2,ep=2"),
                                         ("tiny-deepseek", "tp=2")])
def test_direct_and_loader_land_the_same_bytes_in_the_right_place(model, infer):
    plan = plan_refit(model=model, train="tp=2", infer=infer)
    r = plan.infer_world - 1
    lps = plan.infer.local_params(r)
    ld = build(lps, {t.name: tuple(t.shape) for t in plan.model.tensors})
    land_direct(ld)
    direct = {k: v.clone() for k, v in ld.params.items()}
    for p in ld.params.values():
        p.zero_()
    land_loader(ld)
    for k, v in ld.params.items():
        assert torch.equal(direct[k], v), k
    # every segment holds its HF tensor's box (independently of both paths' code)
    for lp in lps:
        p = ld.params[lp.name]
        for s in lp.segments:
            want = ld.full[s.hf_name][tuple(slice(lo, hi) for lo, hi in s.box)]
            view = p[s.offset[0]] if len(s.offset) > len(s.box) else p
            off = s.offset[1:] if len(s.offset) > len(s.box) else s.offset
            got = view[tuple(slice(o, o + hi - lo) for o, (lo, hi) in zip(off, s.box))]
            assert torch.equal(got, want), (lp.name, s.hf_name)
    assert ld.num_views == sum(len(lp.segments) for lp in lps) and ld.nbytes > 0


def test_host_cost_reports_both_paths():
    got = host_cost(reps=1, n=64)
    assert got["views"] == 64 and got["direct_seconds"] > 0 and got["loader_seconds"] > 0
    assert got["mapping_seconds"] > 0 and got["named_params_seconds"] > 0
