"""What bind refuses, all at once and named (missing, unexpected, shape, dtype, device), through real
modules; what it accepts: ignore regexes, buffers that are weights (Megatron's router expert_bias), and
parameters that require grad, written in place through the views."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from reshardctl.bind.binding import bind
from reshardctl.errors import BindingError, InputError, ReshardError

from helpers.bound_modules import module_of, small_plan, zeros_of
from helpers.parallel_models import tiny_deepseek, tiny_llama


@pytest.fixture(scope="module")
def llama_plan():
    return small_plan(tiny_llama(2), "tp=2", "tp=2")


def test_every_problem_in_one_error_each_with_expected_and_got(llama_plan):
    params = zeros_of(llama_plan.train, 0)
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    fc1 = "decoder.layers.1.mlp.linear_fc1.weight"
    proj = "decoder.layers.0.self_attention.linear_proj.weight"
    norm = "decoder.final_layernorm.weight"
    params.pop(qkv)
    params["decoder.layers.0.self_attention.linear_qkv.weights"] = torch.zeros(1)  # a typo of qkv
    params[fc1] = torch.zeros(3, 64, dtype=torch.bfloat16)                         # wrong shape
    params[proj] = params[proj].float()                                            # wrong dtype
    params[norm] = torch.zeros(params[norm].shape, dtype=torch.bfloat16, device="meta")  # the odd device
    with pytest.raises(BindingError) as e:
        bind(llama_plan, "train", 0, module_of(params))
    msg = str(e.value)
    assert isinstance(e.value, InputError) and e.value.exit_code == 2
    assert msg.startswith("5 binding problems on train rank 0 (megatron tp=2")
    assert re.search(rf"{re.escape(qkv)}: expected a bfloat16 parameter of shape \(\d+, 64\), got nothing of that "
                     rf"name; closest given: decoder.layers.0.self_attention.linear_qkv.weights", msg)
    assert "decoder.layers.0.self_attention.linear_qkv.weights: not a parameter of train rank 0" in msg
    assert f"{fc1}: shape expected (128, 64), got (3, 64)" in msg
    assert f"{proj}: dtype expected torch.bfloat16, got torch.float32" in msg
    assert re.search(rf"{re.escape(norm)}: device expected cpu \(where \d+ of \d+ bound tensors are\), got meta", msg)
    assert e.value.problems == sorted(e.value.problems)


def test_the_listing_is_capped(llama_plan):
    params = {f"extra.{i}": torch.zeros(1) for i in range(60)}
    with pytest.raises(BindingError) as e:
        bind(llama_plan, "infer", 1, params)
    n = len(e.value.problems)
    assert n == 60 + len(llama_plan.infer.local_params(1))  # every extra + every expected one missing
    lines = str(e.value).splitlines()
    assert len(lines) == 1 + 50 + 1 and lines[-1] == f"  ... and {n - 50} more"


def test_ignore_regexes_and_bad_arguments(llama_plan):
    params = zeros_of(llama_plan.infer, 0)
    params["model.rotary_emb.cos_cache"] = torch.zeros(4)
    params["value_head.weight"] = torch.zeros(4)
    with pytest.raises(BindingError, match="2 binding problems"):
        bind(llama_plan, "infer", 0, params)
    b = bind(llama_plan, "infer", 0, params, ignore=[r"rotary_emb\.", r"^value_head\."])
    assert "value_head.weight" not in b.params and len(b.params) == len(llama_plan.infer.local_params(0))
    with pytest.raises(BindingError, match=r"ignore pattern '\(': not a regular expression"):
        bind(llama_plan, "infer", 0, params, ignore=["("])
    with pytest.raises(BindingError, match=r"side_rank: expected 0 <= side_rank < 2, got 2"):
        bind(llama_plan, "infer", 2, params)
    with pytest.raises(BindingError, match=r"side: expected 'train' or 'infer', got 'inference'"):
        bind(llama_plan, "inference", 0, params)
    with pytest.raises(BindingError, match=r"megatron_spec: expected one of te, local, got 'TE'"):
        bind(llama_plan, "train", 0, params, megatron_spec="TE")


def test_pairs_and_a_name_given_twice(llama_plan):
    pairs = list(zeros_of(llama_plan.infer, 0).items())
    b = bind(llama_plan, "infer", 0, iter(pairs))
    assert b.params == tuple(n for n, _ in pairs)
    with pytest.raises(BindingError, match=re.escape(f"{pairs[0][0]}: given twice")):
        bind(llama_plan, "infer", 0, pairs + pairs[:1])


def test_buffers_that_are_weights_are_bound_and_other_buffers_ignored():
    plan = small_plan(tiny_deepseek(2, fp8=False), "tp=2,ep=2,vocab_divisor=128", "tp=2")
    params = zeros_of(plan.train, 0)
    bias = "decoder.layers.1.mlp.router.expert_bias"
    buffers = {lp.name: params.pop(lp.name) for lp in plan.train.local_params(0) if lp.buffer}  # + the MTP layer's
    buffers["decoder.layers.0.self_attention.rotary.inv_freq"] = torch.zeros(8)
    module = module_of(params, buffers)
    assert bias in dict(module.named_buffers()) and bias not in dict(module.named_parameters())
    b = bind(plan, "train", 0, module)
    assert bias in b.params
    (view,) = b.tensors()["model.layers.1.mlp.gate.e_score_correction_bias"]
    view.fill_(3.0)
    assert bool((dict(module.named_buffers())[bias] == 3.0).all())


def test_a_buffer_offered_as_a_parameter_is_refused_and_a_missing_one_named_as_a_buffer():
    """megatron-core registers the router's expert_bias as a buffer (moe/router.py:188): a module that holds it
    as an nn.Parameter is not the model the layout describes (an optimizer would step it), so bind refuses it;
    one without it is told a buffer is missing. A mapping (no parameter/buffer distinction) is bound as given."""
    plan = small_plan(tiny_deepseek(2, fp8=False), "tp=2,ep=2,vocab_divisor=128", "tp=2")
    bias = "decoder.layers.1.mlp.router.expert_bias"
    mtp_bias = "mtp.layers.0.mtp_model_layer.mlp.router.expert_bias"
    assert [lp.name for lp in plan.train.local_params(0) if lp.buffer] == [bias, mtp_bias]
    params = zeros_of(plan.train, 0)
    buffers = {mtp_bias: params.pop(mtp_bias)}
    with pytest.raises(BindingError) as e:
        bind(plan, "train", 0, module_of(params, buffers))
    assert f"{bias}: expected a buffer (the framework registers it with register_buffer" in str(e.value)
    assert "got an nn.Parameter" in str(e.value) and str(e.value).count("  - ") == 1
    params.pop(bias)
    with pytest.raises(BindingError, match=re.escape(f"{bias}: expected a float32 buffer of shape (8,), got "
                                                     "nothing of that name")):
        bind(plan, "train", 0, module_of(params, buffers))
    assert bias in bind(plan, "train", 0, zeros_of(plan.train, 0)).params  # a mapping: bound as given


def test_parameters_that_require_grad_are_written_in_place_without_autograd(llama_plan):
    module = module_of(zeros_of(llama_plan.infer, 1))
    before = {n: (p, p.data_ptr()) for n, p in module.named_parameters()}
    b = bind(llama_plan, "infer", 1, module)
    with torch.no_grad():
        for views in b.tensors().values():
            for v in views:
                v.fill_(1)
    for n, p in module.named_parameters():
        assert p is before[n][0] and p.data_ptr() == before[n][1]
        assert p.requires_grad and p.is_leaf and p.grad is None and p.grad_fn is None
    qkv = dict(module.named_parameters())["model.layers.0.self_attn.qkv_proj.weight"]
    assert bool((qkv == 1).all())


def test_the_same_lists_every_call(llama_plan):
    b = bind(llama_plan, "train", 1, zeros_of(llama_plan.train, 1))
    first, second = b.tensors(), b.tensors()
    assert first is second and all(first[n] is second[n] for n in first)


def test_float8_checkpoint_weights_are_refused_with_the_reason():
    plan = small_plan(tiny_deepseek(2, fp8=True), "tp=2,ep=2,vocab_divisor=128", "tp=1")
    with pytest.raises(BindingError, match=r"float8_e4m3fn\) as bfloat16: a cast to or from float8 needs the "
                                           r"checkpoint's block scales"):
        bind(plan, "train", 0, zeros_of(plan.train, 0))


def test_duplicate_copies_of_a_box_are_landed_from_the_primary(llama_plan, monkeypatch):
    """A rank holding one box twice (an EPLB redundant slot of the same expert, contract: two segments with
    the same (hf_name, box)): the refit moves the first, land_copies() writes the second from it."""
    layout = llama_plan.infer
    real = layout.local_params(0)
    norm = next(lp for lp in real if lp.name == "model.norm.weight")
    (seg,) = norm.segments
    dup = type(norm)("model.norm_copy.weight", norm.shape, norm.dtype,
                     (type(seg)(seg.hf_name, seg.box, "model.norm_copy.weight", seg.offset),))
    monkeypatch.setattr(layout, "local_params", lambda rank: real + [dup] if rank == 0 else [])
    params = zeros_of(llama_plan.infer, 0)
    b = bind(llama_plan, "infer", 0, params)
    assert len(b.tensors()["model.norm.weight"]) == 1
    b.tensors()["model.norm.weight"][0].fill_(5)
    assert bool((params["model.norm_copy.weight"] == 0).all())
    b.land_copies()
    assert bool((params["model.norm_copy.weight"] == 5).all())


@pytest.mark.parametrize("fault", ["segment_dropped", "segment_foreign", "segment_past_end"])
def test_a_layout_whose_segments_and_holdings_disagree_is_an_internal_error_naming_both(llama_plan, monkeypatch,
                                                                                         fault):
    """A layout bug (no real layout produces one on demand: local_params is altered here): a held box no
    segment places, a segment of a box the rank does not hold, a segment past its parameter's end."""
    layout = llama_plan.infer
    real = layout.local_params(0)
    norm = next(lp for lp in real if lp.name == "model.norm.weight")
    (seg,) = norm.segments
    if fault == "segment_dropped":
        changed = dataclasses.replace(norm, segments=())
        want = r"model.norm.weight box \(\(0, 64\),\): held by infer rank 0 .* but no parameter segment"
    elif fault == "segment_foreign":
        changed = dataclasses.replace(norm, segments=(seg, dataclasses.replace(seg, hf_name="lm_head.weight")))
        want = r"lm_head.weight box \(\(0, 64\),\): a segment in model.norm.weight, but the plan's holdings"
    else:
        changed = dataclasses.replace(norm, segments=(dataclasses.replace(seg, offset=(8,)),))
        want = r"segment of model.norm.weight box \(\(0, 64\),\) in model.norm.weight: offset \(8,\)"
    monkeypatch.setattr(layout, "local_params", lambda rank: [changed if lp is norm else lp for lp in real])
    with pytest.raises(ReshardError, match="internal error binding infer rank 0") as e:
        bind(llama_plan, "infer", 0, zeros_of(llama_plan.infer, 0))
    assert not isinstance(e.value, BindingError) and re.search(want, str(e.value)), str(e.value)
