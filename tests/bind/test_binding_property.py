"""Every element a binding exposes is written exactly once, and the views are a bijection onto the boxes
the plan holds: on the layouts of the small test models (Megatron tp/pp/ep/etp/vpp, MLA, MTP, router bias;
vLLM tp/dp/ep incl. tp > kv heads, round_robin, EPLB redundant slots, padded vocab; DTensor HF names)."""

from __future__ import annotations

import dataclasses
import inspect

import torch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.bind.binding import bind
from reshardctl.errors import LayoutError
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.placement import box_numel

from helpers.bound_modules import small_plan, zeros_of
from helpers.parallel_models import tiny_deepseek, tiny_llama, tiny_qwen3_moe
from helpers.planner_scenarios import SCALE, SETTINGS


def _grouped(model, n_group: int):
    return dataclasses.replace(model, config={**model.config, "n_group": n_group})


# (model, trainer parallel string, trainer style, inference parallel string, inference style)
CONFIGS = [
    (lambda: tiny_llama(2), "tp=2", "megatron", "tp=2", "vllm"),
    (lambda: tiny_llama(4), "tp=4,pp=2", "megatron", "tp=8", "vllm"),            # kv heads replicated (4 < 8)
    (lambda: tiny_llama(4), "tp=1,pp=2,vpp=2", "megatron", "tp=2,pp=2", "vllm"),  # vpp chunks; vLLM stages
    (lambda: tiny_llama(4, tie=True), "tp=2,pp=2", "megatron", "tp=2,dp=2", "vllm"),
    (lambda: tiny_llama(2), "tp=2,dp=2", "dtensor", "tp=4", "dtensor"),           # HF names
    (lambda: tiny_qwen3_moe(2), "tp=2,ep=2,vocab_divisor=128", "megatron", "tp=2,ep=2", "vllm"),
    (lambda: tiny_qwen3_moe(2), "tp=2,ep=4,etp=1,vocab_divisor=128", "megatron", "tp=1,ep=4", "vllm"),
    (lambda: tiny_qwen3_moe(2), "tp=2,ep=2,etp=2,vocab_divisor=128", "megatron", "tp=2,ep=2,redundant=2", "vllm"),
    # EPLB: 8 + 16 slots over 2 EP ranks, 12 each: experts 0-3 twice on rank 0 (land_copies writes the second)
    (lambda: tiny_qwen3_moe(2), "tp=1,vocab_divisor=128", "megatron", "tp=2,ep=2,redundant=16", "vllm"),
    (lambda: _grouped(tiny_qwen3_moe(2), 2), "tp=2,vocab_divisor=128", "megatron", "tp=2,ep=2,placement=round_robin", "vllm"),
    (lambda: tiny_deepseek(2, fp8=False), "tp=2,ep=2,vocab_divisor=128", "megatron", "tp=2", "vllm"),
    (lambda: tiny_deepseek(2, fp8=False), "tp=1,pp=2,ep=2,vocab_divisor=128", "megatron", "tp=2,ep=2", "vllm"),
]


def _plan(cache, key, model, tr, inf, ts, ist):
    if key not in cache:
        try:
            cache[key] = small_plan(model, tr, inf, ts, ist)
        except LayoutError as e:
            if "twice" not in str(e):
                raise
            cache[key] = None
    if cache[key] is None:  # this tree's vLLM layout keeps one copy per rank (i23-vllm lists both slots)
        pytest.skip("this tree's vLLM layout refuses an expert twice on one EP rank")
    return cache[key]


_cache: dict = {}


def _as_float32(model):
    """The same model with every tensor float32 (unique integers up to 2**24 survive exactly)."""
    return dataclasses.replace(model, tensors=tuple(dataclasses.replace(t, dtype="float32") for t in model.tensors))


def _alias_key(v: torch.Tensor) -> tuple:
    """Identical views (same storage, offset, shape, strides) of two HF tensors."""
    return (v.data_ptr(), tuple(v.shape), v.stride())


@pytest.mark.parametrize("i", range(len(CONFIGS)))
@settings(max_examples=4 * SCALE, **SETTINGS)
@given(side=st.sampled_from(("train", "infer")), pick=st.integers(0, 63))
def test_every_bound_element_is_written_exactly_once(i, side, pick):
    model, tr, ts, inf, ist = CONFIGS[i]
    plan = _plan(_cache, i, model(), tr, inf, ts, ist)
    layout = plan.train if side == "train" else plan.infer
    _written_once(plan, side, pick % layout.world_size, zeros_of(layout, pick % layout.world_size))


LOCAL_SPEC = [(lambda: tiny_llama(4), "tp=2,pp=2"), (lambda: tiny_qwen3_moe(2), "tp=2,ep=2,vocab_divisor=128")]


@pytest.mark.parametrize("i", range(len(LOCAL_SPEC)))
@settings(max_examples=4 * SCALE, **SETTINGS)
@given(pick=st.integers(0, 63))
def test_megatron_local_spec_names_are_written_exactly_once(i, pick):
    """megatron_spec="local": the names of megatron-core's local layer spec (``input_layernorm``,
    ``experts.local_experts.{i}``), from ``MegatronLayout.local_params(rank, spec="local")`` (i23-mcore)."""
    if "spec" not in inspect.signature(MegatronLayout.local_params).parameters:
        pytest.skip("this tree's MegatronLayout.local_params has no spec parameter yet (i23-mcore adds it)")
    model, tr = LOCAL_SPEC[i]
    plan = _plan(_cache, ("local", i), model(), tr, "tp=2", "megatron", "vllm")
    rank = pick % plan.train.world_size
    lps = plan.train.local_params(rank, spec="local")
    assert any(".input_layernorm.weight" in lp.name for lp in lps)
    params = {lp.name: torch.zeros(lp.shape, dtype=getattr(torch, lp.dtype)) for lp in lps}
    _written_once(plan, "train", rank, params, megatron_spec="local")


def _written_once(plan, side: str, rank: int, params: dict, **kw) -> None:
    """Add 1 through every view (and land_copies): every element 0 or 1, the ones = the held boxes + duplicates."""
    b = bind(plan, side, rank, params, **kw)
    holdings = plan.src_holdings(rank) if side == "train" else plan.dst_holdings(rank)
    views = b.tensors()
    seen = set()  # a trainer reads a shared parameter (Megatron's MTP embedding) for two HF tensors
    held = 0
    assert set(views) == {plan.model.tensors[t].name for t in holdings}
    for t, boxes in holdings.items():
        name = plan.model.tensors[t].name
        assert [tuple(v.shape) for v in views[name]] == [tuple(max(0, e - s) for s, e in bx) for bx in boxes]
        for bx, v in zip(boxes, views[name]):
            key = _alias_key(v)
            if key in seen:
                assert side == "train", f"{name} {bx}: an inference view shares its elements with another"
                continue
            seen.add(key)
            held += box_numel(bx)
            v.add_(1)
    b.land_copies()
    dup = sum(d.numel() for d in b._copies[0])
    ones = 0
    for name, p in params.items():
        assert bool(((p == 0) | (p == 1)).all()), f"{name}: an element written more than once"
        ones += int((p == 1).sum())
    assert ones == held + dup


@pytest.mark.parametrize("i", range(len(CONFIGS)))
@settings(max_examples=4 * SCALE, **SETTINGS)
@given(side=st.sampled_from(("train", "infer")), pick=st.integers(0, 63))
def test_views_are_a_bijection_onto_the_held_boxes(i, side, pick):
    model, tr, ts, inf, ist = CONFIGS[i]
    plan = _plan(_cache, ("f32", i), _as_float32(model()), tr, inf, ts, ist)
    layout = plan.train if side == "train" else plan.infer
    rank = pick % layout.world_size
    params = zeros_of(layout, rank)
    b = bind(plan, side, rank, params)
    holdings = plan.src_holdings(rank) if side == "train" else plan.dst_holdings(rank)
    refs, base = {}, 1  # every element of every HF tensor a distinct value >= 1 (0 = never written)
    for t in plan.model.tensors:
        n = max(1, box_numel(tuple((0, s) for s in t.shape)))
        refs[t.name] = (torch.arange(n, dtype=torch.float64) + base).to(torch.float32).reshape(t.shape)
        base += n
    views = b.tensors()
    expected, seen, wrote = [], set(), []
    for t, boxes in holdings.items():
        name = plan.model.tensors[t].name
        for bx, v in zip(boxes, views[name]):
            if _alias_key(v) in seen:  # the trainer's shared parameter (see above): written once
                assert side == "train"
                continue
            seen.add(_alias_key(v))
            part = refs[name][tuple(slice(s, e) for s, e in bx)]
            v.copy_(part)
            expected.append(part.reshape(-1))
            wrote.append((name, bx, v))
    b.land_copies()
    for name, bx, v in wrote:  # read back: no two views share an element
        assert torch.equal(v, refs[name][tuple(slice(s, e) for s, e in bx)]), (name, bx)
    expected += [d.reshape(-1) for d in b._copies[0]]
    written = torch.cat([p.reshape(-1) for p in params.values()])
    assert torch.equal(torch.sort(written[written != 0]).values, torch.sort(torch.cat(expected)).values)
