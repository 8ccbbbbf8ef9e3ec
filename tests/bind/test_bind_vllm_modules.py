"""bind on modules built as vLLM builds them (tests/helpers/vllm_modules.py: names, shapes and weight
loaders read from vLLM's source, written without reshardctl's layout code): writing the full HF tensors
through a binding's views (then ``land_copies()``) leaves every parameter byte for byte as vLLM's own
loaders leave it: fused qkv with replicated kv heads, gate_up, expert stacks (EP linear, round_robin,
EPLB with an expert twice on one rank), padded vocabulary, MLA, the MTP draft under ``draft/``.

The helper comes with the vLLM layout work (branch i23-vllm); until it is in the tree this module skips."""

from __future__ import annotations

import pytest
import torch

from reshardctl.bind.binding import bind
from reshardctl.layout.placement import full_box
from reshardctl.runtime.synthetic_weights import synthetic_region

from helpers.bound_modules import small_plan
from helpers.parallel_models import tiny_deepseek, tiny_llama, tiny_qwen3_moe

vm = pytest.importorskip("helpers.vllm_modules")

CASES = [
    (lambda: tiny_llama(2), vm.Deployment(tp=2)),
    (lambda: tiny_llama(2), vm.Deployment(tp=8)),                      # 4 kv heads replicated over 8 ranks
    (lambda: tiny_llama(4), vm.Deployment(tp=2, pp=2)),
    (lambda: tiny_qwen3_moe(2), vm.Deployment(tp=2, expert_parallel=True)),
    (lambda: tiny_qwen3_moe(2), vm.Deployment(tp=2, expert_parallel=True, redundant=16)),  # experts twice on a rank
    (lambda: tiny_qwen3_moe(2), vm.Deployment(tp=2, expert_parallel=True, redundant=2)),
    (lambda: tiny_deepseek(2, fp8=False), vm.Deployment(tp=2)),        # MLA, shared experts, router bias, MTP
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_writing_through_a_binding_equals_vllms_own_loaders(case):
    model_of, dep = CASES[case]
    model = model_of()
    plan = small_plan(model, "tp=1", dep.spec(), "dtensor", "vllm")
    hf = {t.name: synthetic_region(t, full_box(t.shape), 1) for t in model.tensors}
    for rank in range(dep.world):
        target = vm.vllm_module(model, dep, rank)
        draft = vm.vllm_module(model, dep, rank, draft=True)
        params = {**dict(target.named_parameters()),
                  **{"draft/" + n: p for n, p in draft.named_parameters()}}
        reference = {n: torch.zeros_like(p) for n, p in params.items()}
        with torch.no_grad():
            for p in params.values():
                p.zero_()
        vm.load_like_vllm(model, dep, rank, reference, hf)
        binding = bind(plan, "infer", rank, params)
        with torch.no_grad():
            for i, boxes in plan.dst_holdings(rank).items():
                name = model.tensors[i].name
                for box, view in zip(boxes, binding.tensors()[name]):
                    view.copy_(hf[name][tuple(slice(a, b) for a, b in box)])
        binding.land_copies()
        for n, p in params.items():
            assert torch.equal(p.view(torch.uint8), reference[n].view(torch.uint8)), (rank, n)
