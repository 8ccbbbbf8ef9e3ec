"""Megatron, vLLM and SGLang layouts number their placement classes from their placement keys
(``StagedPlacements.placement_classes``): the classes, their numbers and their representatives must be
those of the walk over every tensor (``SideLayout.placement_classes``), on catalog models and tiny ones,
pipeline splits, expert parallelism, a per-layer EPLB map, tied embeddings and fp8 scales (the walk)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.parallel_models import tiny_deepseek, tiny_llama, tiny_qwen3_moe
from reshardctl.errors import LayoutError
from reshardctl.layout.build import build_layout
from reshardctl.layout.side import SideLayout
from reshardctl.models import load_model

CASES = [
    ("deepseek-v3", "train", "pp=16,ep=16,first=3,last=2"),
    ("deepseek-v3", "train", "tp=8,pp=4,ep=8,etp=1,first=16,last=15"),
    ("deepseek-v3", "infer", "tp=32,dp=8"),
    ("deepseek-v3", "infer", "tp=8,ep=8"),
    ("deepseek-v3", "infer", "tp=4,pp=2,ep=8"),
    ("qwen3-235b-a22b", "train", "tp=4,pp=2,ep=8,etp=1,dp=8"),
    ("qwen3-235b-a22b", "infer", "tp=8,dp=8"),
    ("qwen3-30b-a3b", "infer", "tp=2,dp=2,ep=4,redundant=8"),
    ("llama-3.1-70b", "train", "tp=8,pp=8"),
    ("llama-3.1-70b", "infer", "tp=8,pp=2"),
    ("tiny-llama", "infer", "tp=2,pp=2"),
]


def _same_as_the_walk(model, side, spec, style=None, keyed=True):
    kw = {"style": style} if style else {}
    a, b = build_layout(model, side, spec, **kw), build_layout(model, side, spec, **kw)
    scales = any(t.kind == "scale_inv" for t in model.tensors)
    assert (not scales and b._placement_keys() is not None) == keyed  # the keys, not the walk again
    want_classes, want_reps = SideLayout.placement_classes(a)
    got_classes, got_reps = b.placement_classes()
    assert np.array_equal(got_classes, want_classes)
    assert [(p.template.shape, p.template.holdings, p.ranks) for p in got_reps] == \
        [(p.template.shape, p.template.holdings, p.ranks) for p in want_reps]
    firsts = [int(np.argmax(got_classes == c)) for c in range(len(got_reps))]  # each class's first tensor
    assert all(b.placement(i) is p for i, p in zip(firsts, got_reps))
    return b


@pytest.mark.parametrize("name, side, spec", CASES)
def test_catalog_layouts(name, side, spec):
    _same_as_the_walk(load_model(name), side, spec)


def test_sglang_layout():
    _same_as_the_walk(load_model("qwen3-30b-a3b"), "infer", "tp=4,ep=4", style="sglang")


def test_per_layer_eplb_map(tmp_path):
    m = load_model("qwen3-30b-a3b")
    E, R, ep = m.dims.num_experts, 8, 4
    rng = random.Random(3)
    per_layer = []
    for _ in m.dims.moe_layers:
        phys = list(range(E))
        rng.shuffle(phys)
        per_layer.append(phys + [rng.randrange(E) for _ in range(R)])
    path = tmp_path / "map.json"
    path.write_text(json.dumps(per_layer))
    lay = _same_as_the_walk(m, "infer", f"tp=2,dp=2,ep={ep},redundant={R},expert_map={path}")
    first, second = m.dims.moe_layers[:2]  # the maps differ per layer: so do the placements
    assert any(lay.placement(m.index(f"model.layers.{first}.mlp.experts.{e}.down_proj.weight")).ranks
               != lay.placement(m.index(f"model.layers.{second}.mlp.experts.{e}.down_proj.weight")).ranks
               or lay.placement(m.index(f"model.layers.{first}.mlp.experts.{e}.down_proj.weight")).template
               != lay.placement(m.index(f"model.layers.{second}.mlp.experts.{e}.down_proj.weight")).template
               for e in range(E))


def test_fp8_scales_take_the_walk():
    _same_as_the_walk(tiny_deepseek(layers=4), "train", "pp=2,ep=2,etp=1", keyed=False)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(["llama", "llama-tied", "qwen3moe", "deepseek-bf16"]),
       side=st.sampled_from(["train", "infer"]), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
       ep=st.sampled_from([1, 2, 4]))
def test_tiny_models_any_split(model, side, tp, pp, ep):
    m = {"llama": lambda: tiny_llama(layers=4), "llama-tied": lambda: tiny_llama(layers=4, tie=True),
         "qwen3moe": lambda: tiny_qwen3_moe(layers=4), "deepseek-bf16": lambda: tiny_deepseek(layers=4, fp8=False)}[model]()
    spec = f"tp={tp},pp={pp}" + (f",ep={ep}" if m.dims.num_experts and ep > 1 else "")
    if side == "train" and m.dims.num_experts and ep > 1:
        spec += ",etp=1"
    try:
        _same_as_the_walk(m, side, spec)
    except LayoutError:
        pass  # a split the model does not allow: both constructions refuse it


def test_combined_numbers_rows_and_refuses_an_overflow():
    from reshardctl.layout.shard_rules import StagedPlacements

    a, b = np.array([0, 1, 1, 0, 2]), np.array([3, 0, 3, 3, 0])
    got = StagedPlacements._combined(a, b)
    assert [len({int(x) for x, r in zip(got, zip(a, b)) if r == row}) for row in set(zip(a, b))] == [1] * 4
    assert len(set(got.tolist())) == len(set(zip(a.tolist(), b.tolist())))
    big = np.array([0, (1 << 31) - 2])  # radix 2**31 - 1: two of them stay below 2**62
    assert StagedPlacements._combined(big, big) is not None
    assert StagedPlacements._combined(big, big, np.array([0, 1])) is None
    assert StagedPlacements._combined(np.array([0, -1])) is None
