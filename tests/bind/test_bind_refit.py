"""A real 2 + 2 gloo refit through bindings, with today's Refitter (one default world, trainers first):
trainer tp=2 with Megatron-core (Transformer Engine) names, inference tp=2 with vLLM's fused names,
``binding.tensors()`` passed as ``local_src`` / ``local_dst``.

Both sides' modules are filled by reference loaders written here from the frameworks' arithmetic
(Megatron: q/k/v interleaved per query group, then split over TP; ``linear_fc1`` = [gate_r; up_r];
vLLM: ``qkv_proj`` = [q_r | k_r | v_r], ``gate_up_proj`` = [gate_r; up_r], vocab padded to 64 and
split), never from reshardctl's layout code; after every commit every element of every inference
parameter is compared, byte for byte, with that reference (padding rows keep their sentinel), and a
refit corrupted in flight leaves every parameter as it was.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from reshardctl import api
from reshardctl.bind.binding import bind
from reshardctl.errors import ReshardError
from reshardctl.layout.placement import full_box
from reshardctl.runtime.synthetic_weights import synthetic_region

from helpers.bound_modules import module_of
from helpers.small_llama import SMALL_LLAMA
from helpers.spawned_ranks import run_ranks

CONFIG = {**SMALL_LLAMA, "vocab_size": 250}  # vLLM pads 250 to 256: 128 rows per rank, rank 1 has 6 padding rows
TP, PAD_TO, SENTINEL = 2, 64, 7.0


def _full(plan, step: int) -> dict[str, torch.Tensor]:
    return {t.name: synthetic_region(t, full_box(t.shape), step) for t in plan.model.tensors}


def _rows(x: torch.Tensor, r: int, n: int) -> torch.Tensor:
    per = x.shape[0] // n
    return x[r * per:(r + 1) * per]


def _cols(x: torch.Tensor, r: int, n: int) -> torch.Tensor:
    per = x.shape[1] // n
    return x[:, r * per:(r + 1) * per]


def megatron_params(full: dict, r: int) -> dict[str, torch.Tensor]:
    """Megatron-core GPT (TE spec) parameters of TP rank ``r`` from the HF tensors."""
    nh, ng, hd = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"], CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    qpg = nh // ng
    out = {"embedding.word_embeddings.weight": _rows(full["model.embed_tokens.weight"], r, TP),
           "decoder.final_layernorm.weight": full["model.norm.weight"],
           "output_layer.weight": _rows(full["lm_head.weight"], r, TP)}
    for l in range(CONFIG["num_hidden_layers"]):
        h, m = f"model.layers.{l}.", f"decoder.layers.{l}."
        q, k, v = (full[h + f"self_attn.{x}_proj.weight"] for x in "qkv")
        groups = [torch.cat([q[g * qpg * hd:(g + 1) * qpg * hd], k[g * hd:(g + 1) * hd], v[g * hd:(g + 1) * hd]])
                  for g in range(ng)]
        out[m + "self_attention.linear_qkv.weight"] = _rows(torch.cat(groups), r, TP)
        out[m + "self_attention.linear_qkv.layer_norm_weight"] = full[h + "input_layernorm.weight"]
        out[m + "self_attention.linear_proj.weight"] = _cols(full[h + "self_attn.o_proj.weight"], r, TP)
        out[m + "mlp.linear_fc1.layer_norm_weight"] = full[h + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([_rows(full[h + "mlp.gate_proj.weight"], r, TP),
                                                      _rows(full[h + "mlp.up_proj.weight"], r, TP)])
        out[m + "mlp.linear_fc2.weight"] = _cols(full[h + "mlp.down_proj.weight"], r, TP)
    return {n: t.clone() for n, t in out.items()}


def _padded_rows(x: torch.Tensor, r: int) -> torch.Tensor:
    padded = -(-x.shape[0] // PAD_TO) * PAD_TO
    per = padded // TP
    out = torch.full((per,) + tuple(x.shape[1:]), SENTINEL, dtype=x.dtype)
    part = x[r * per:(r + 1) * per]
    out[:part.shape[0]] = part
    return out


def vllm_params(full: dict, r: int) -> dict[str, torch.Tensor]:
    """vLLM LlamaForCausalLM parameters of TP rank ``r``: fused qkv_proj and gate_up_proj, padded vocab."""
    nkv = CONFIG["num_key_value_heads"]
    rep = max(1, TP // nkv)
    out = {"model.embed_tokens.weight": _padded_rows(full["model.embed_tokens.weight"], r),
           "model.norm.weight": full["model.norm.weight"],
           "lm_head.weight": _padded_rows(full["lm_head.weight"], r)}
    for l in range(CONFIG["num_hidden_layers"]):
        h = f"model.layers.{l}."
        kv_r = r // rep
        out[h + "self_attn.qkv_proj.weight"] = torch.cat([
            _rows(full[h + "self_attn.q_proj.weight"], r, TP),
            _rows(full[h + "self_attn.k_proj.weight"], kv_r, max(1, min(TP, nkv))),
            _rows(full[h + "self_attn.v_proj.weight"], kv_r, max(1, min(TP, nkv)))])
        out[h + "self_attn.o_proj.weight"] = _cols(full[h + "self_attn.o_proj.weight"], r, TP)
        out[h + "input_layernorm.weight"] = full[h + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = full[h + "post_attention_layernorm.weight"]
        out[h + "mlp.gate_up_proj.weight"] = torch.cat([_rows(full[h + "mlp.gate_proj.weight"], r, TP),
                                                        _rows(full[h + "mlp.up_proj.weight"], r, TP)])
        out[h + "mlp.down_proj.weight"] = _cols(full[h + "mlp.down_proj.weight"], r, TP)
    return {n: t.clone() for n, t in out.items()}


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _corrupt_at(step: int):
    def tap(at, buf, n):
        if at == step and n > 0:
            buf[n // 2] ^= 0x5A
    return tap


def _rank(rank: int, port: int, cfg: str, q) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
        plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2")
        refitter = api.Refitter(plan, timeout_s=60)
        trainer, r = rank < 2, rank % 2
        ref = megatron_params if trainer else vllm_params
        module = module_of(ref(_full(plan, 0), r))
        params = dict(module.named_parameters())
        binding = bind(plan, "train" if trainer else "infer", r, module)
        if rank == 3:
            refitter.executor.tap = _corrupt_at(3)
        results = []
        for step in (1, 2, 3):
            if trainer:  # the optimizer's step: the same parameters, new values in place
                with torch.no_grad():
                    for name, t in ref(_full(plan, step), r).items():
                        params[name].copy_(t)
            try:
                if trainer:
                    refitter.refit(step, local_src=binding.tensors())
                else:
                    refitter.refit(step, local_dst=binding.tensors())
                    binding.land_copies()
                ok = True
            except ReshardError as exc:
                ok = type(exc).__name__
            held = None
            if not trainer:  # which step every element of every parameter holds (padding: the sentinel)
                for want in (step, step - 1):
                    expect = vllm_params(_full(plan, want), r)
                    if set(expect) == set(params) and all(_same_bytes(params[n], expect[n]) for n in expect):
                        held = want
                        break
            results.append((step, ok, held))
        refitter.close()
        dist.destroy_process_group()
        q.put((rank, results, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


@pytest.fixture(scope="module")
def refits(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("bind") / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    return run_ranks(_rank, 4, lambda r, port, q: (r, port, str(cfg), q), timeout_s=600)


def test_bound_inference_parameters_hold_the_trainers_weights_bit_exact(refits):
    for r in (2, 3):
        assert refits[r][:2] == [(1, True, 1), (2, True, 2)], refits[r]
    for r in (0, 1):
        assert [ok for _, ok, _ in refits[r][:2]] == [True, True]


def test_a_corrupted_refit_leaves_every_bound_parameter_as_it_was(refits):
    """A byte flipped on inference rank 1 at step 3: every rank refuses, both inference ranks' parameters
    (padding included) still hold step 2 in full."""
    for r in (2, 3):
        assert refits[r][2] == (3, "VerificationError", 2)
    for r in (0, 1):
        assert refits[r][2][1] == "VerificationError"
