"""Dump what megatron-core really builds: per rank, ``named_parameters()`` and ``named_buffers()`` (name, shape,
dtype) of ``GPTModel``s with the LOCAL layer spec, on gloo CPU ranks, into ``<config>.json`` beside this file.

Runs only with megatron-core installed (a separate venv, see README.md here); the tests read the JSON only.
Each configuration names the tests' model builder (tests/helpers/parallel_models.py) and the reshardctl
parallel spec string the layout is built from, so the test rebuilds the same model; the megatron dimensions
below are those of that builder (the test checks them against the ModelSpec).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent

LLAMA = dict(hidden=64, heads=8, kv=4, head_dim=8, vocab=1000, ffn=128)
QWEN3_MQA = dict(hidden=64, heads=4, kv=1, head_dim=16, vocab=1000, ffn=128, qk_norm=True)
QWEN3_MOE = dict(hidden=64, heads=8, kv=2, head_dim=16, vocab=1003, ffn=128, qk_norm=True, experts=8, moe_ffn=32)
DEEPSEEK = dict(hidden=256, heads=8, kv=8, head_dim=24, vocab=1111, ffn=512, qk_norm=True, experts=8, moe_ffn=128,
                shared=1, first_dense=1, expert_bias=True,
                mla=dict(q_lora=128, kv_lora=64, nope=16, rope=8, v=16))

# engineer "archs2": GLM-4.5 MoE (q/k/v biases, qk-norm, a dense first layer, shared experts, router expert bias,
# MTP), as Megatron-Bridge's GLM45Bridge provider sets it (add_qkv_bias=attention_bias, qk_layernorm=use_qk_norm)
GLM45 = dict(hidden=64, heads=8, kv=2, head_dim=16, vocab=200, ffn=128, qk_norm=True, experts=8, moe_ffn=32,
             shared=1, first_dense=1, expert_bias=True, qkv_bias=True)
GLM45_KW = {"L": 2, "mtp": 1, "H": 64, "hd": 16, "V": 200, "I": 128, "Im": 32}

# name: (builder, builder kwargs, reshardctl parallel spec, megatron dims, layers, tp, pp, vpp, ep, etp, extra)
CONFIGS = {
    "dense_tp2": ("tiny_llama", {"layers": 2}, "tp=2", LLAMA, 2, 2, 1, None, 1, None, {}),
    "qknorm_tp2_one_kv_group": ("tiny_qwen3", {"layers": 2}, "tp=2", QWEN3_MQA, 2, 2, 1, None, 1, None, {}),
    "dense_pp2": ("tiny_llama", {"layers": 4}, "pp=2", LLAMA, 4, 1, 2, None, 1, None, {}),
    "dense_pp2_vpp2": ("tiny_llama", {"layers": 4}, "pp=2,vpp=2", LLAMA, 4, 1, 2, 2, 1, None, {}),
    "tied_pp2": ("tiny_llama", {"layers": 2, "tie": True}, "pp=2", LLAMA, 2, 1, 2, None, 1, None, {"tie": True}),
    "moe_tp2_ep2_etp1": ("tiny_qwen3_moe", {"layers": 2}, "tp=2,ep=2,etp=1,vocab_divisor=128", QWEN3_MOE,
                         2, 2, 1, None, 2, 1, {}),
    "moe_tp2_dp2_ep2_etp2": ("tiny_qwen3_moe", {"layers": 2}, "tp=2,dp=2,ep=2,etp=2,vocab_divisor=128", QWEN3_MOE,
                             2, 2, 1, None, 2, 2, {}),
    "mla_moe_mtp_tp2_ep2": ("tiny_deepseek", {"layers": 2, "fp8": False},
                            "tp=2,ep=2,etp=1,vocab_divisor=128", DEEPSEEK, 2, 2, 1, None, 2, 1, {"mtp": 1}),
    "mla_moe_mtp_tp2_pp2_ep2": ("tiny_deepseek", {"layers": 2, "fp8": False},
                                "tp=2,pp=2,ep=2,etp=1,vocab_divisor=128", DEEPSEEK, 2, 2, 2, None, 2, 1, {"mtp": 1}),
    # Megatron-Bridge's use_tp_pp_dp_mapping=True: initialize_model_parallel(order="tp-cp-ep-pp-dp")
    "moe_tp2_pp2_dp2_ep2_bridge_order": ("tiny_qwen3_moe", {"layers": 2},
                                         "tp=2,pp=2,dp=2,ep=2,etp=1,vocab_divisor=128,rank_order=tp-cp-ep-pp-dp",
                                         QWEN3_MOE, 2, 2, 2, None, 2, 1, {"order": "tp-cp-ep-pp-dp"}),
    "mla_no_q_lora_tp2": ("tiny_deepseek", {"layers": 2, "fp8": False, "q_lora": 0},
                          "tp=2,ep=2,etp=1,vocab_divisor=128", DEEPSEEK, 2, 2, 1, None, 2, 1, {"mtp": 1, "q_lora": 0}),
    "glm45_moe_mtp_tp2_ep2": ("glm4_moe_model", GLM45_KW, "tp=2,ep=2,etp=1", GLM45, 2, 2, 1, None, 2, 1,
                              {"mtp": 1}),  # archs2
}
# engineer "archs1": Qwen2 (add_qkv_bias; Megatron-Bridge's Qwen2 provider sets add_qkv_bias=True) and Qwen2-MoE
# (shared expert of 2 x moe_ffn with moe_shared_expert_gate=True, as Bridge's Qwen2-MoE provider), kv 2 < tp 4
QWEN2 = dict(hidden=64, heads=8, kv=2, head_dim=8, vocab=1000, ffn=128, qkv_bias=True)
QWEN2_MOE = dict(hidden=64, heads=8, kv=2, head_dim=8, vocab=1003, ffn=128, qkv_bias=True, experts=8, moe_ffn=32,
                 shared=2, first_dense=1, shared_gate=True)
CONFIGS.update({
    "qwen2_qkv_bias_tp4": ("tiny_qwen2", {"layers": 2}, "tp=4", QWEN2, 2, 4, 1, None, 1, None, {}),
    "qwen2_moe_shared_gate_tp2_ep2": ("tiny_qwen2_moe", {"layers": 2}, "tp=2,ep=2,etp=1,vocab_divisor=128",
                                      QWEN2_MOE, 2, 2, 1, None, 2, 1, {}),
})


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def padded_vocab(vocab: int, tp: int, spec: str) -> int:
    """Megatron-LM's vocab_size_with_padding when the spec gives vocab_divisor, else unpadded."""
    for kv in spec.split(","):
        k, _, v = kv.partition("=")
        if k == "vocab_divisor":
            m = int(v) * tp
            return -(-vocab // m) * m
    return vocab


def build_config(dims: dict, layers: int, tp: int, pp: int, vpp, ep: int, etp, extra: dict):
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kw = dict(num_layers=layers, hidden_size=dims["hidden"], num_attention_heads=dims["heads"],
              num_query_groups=dims["kv"], kv_channels=dims["head_dim"], ffn_hidden_size=dims["ffn"],
              tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
              virtual_pipeline_model_parallel_size=vpp, expert_model_parallel_size=ep,
              expert_tensor_parallel_size=etp, normalization="RMSNorm", gated_linear_unit=True,
              activation_func=torch.nn.functional.silu, add_bias_linear=False, qk_layernorm=bool(dims.get("qk_norm")),
              use_cpu_initialization=True, perform_initialization=False, params_dtype=torch.bfloat16, bf16=True,
              pipeline_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0)
    if dims.get("experts"):
        kw.update(num_moe_experts=dims["experts"], moe_ffn_hidden_size=dims["moe_ffn"], moe_router_topk=2,
                  moe_grouped_gemm=False, moe_token_dispatcher_type="allgather")
        if dims.get("first_dense"):
            kw["moe_layer_freq"] = [0] * dims["first_dense"] + [1] * (layers - dims["first_dense"])
        if dims.get("shared"):
            kw["moe_shared_expert_intermediate_size"] = dims["moe_ffn"] * dims["shared"]
        if dims.get("shared_gate"):  # archs1: Qwen2-MoE
            kw["moe_shared_expert_gate"] = True
        if dims.get("expert_bias"):
            kw.update(moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid")
    if dims.get("qkv_bias"):  # Qwen2, GLM-4.5
        kw["add_qkv_bias"] = True
    if extra.get("mtp"):
        kw["mtp_num_layers"] = extra["mtp"]
    mla = dims.get("mla")
    if mla:
        q_lora = extra.get("q_lora", mla["q_lora"])
        kw.update(multi_latent_attention=True, q_lora_rank=q_lora or None, kv_lora_rank=mla["kv_lora"],
                  qk_head_dim=mla["nope"], qk_pos_emb_head_dim=mla["rope"], v_head_dim=mla["v"],
                  rope_type="rope")
        kw.pop("kv_channels")
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def mla_core_attention():
    """megatron-core 0.16.1's local spec gives MLA the local DotProductAttention, which refuses the
    k_channels / v_channels that MLASelfAttention passes it (multi_latent_attention.py:162-163): an MLA model
    cannot be built with the local spec as released. Core attention holds no parameter, so this one drops the
    two arguments and changes no name."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MlaCoreAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            super().__init__(*args, **kwargs)

    return MlaCoreAttention


def rank_main(rank: int, world: int, name: str, init_file: str, out_dir: str) -> None:
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec

    from megatron.core.transformer.module import Float16Module

    # CPU ranks: the router's buffers are made on torch.cuda.current_device(), and tied embeddings with pp > 1
    # are all-reduced after weight.data.cuda() (LanguageModule.setup_embeddings_and_output_layer): keep both
    # on the CPU
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    MlaCoreAttention = mla_core_attention()
    # multi_latent_attention.py sets HAVE_TE when the TE extension module imports, which it does without TE
    # (its classes are MagicMock stand-ins there), then isinstance(.., TELinear) fails: say what is true
    import megatron.core.transformer.multi_latent_attention as mla_module
    mla_module.HAVE_TE = isinstance(mla_module.TELinear, type)
    builder, bkw, spec, dims, layers, tp, pp, vpp, ep, etp, extra = CONFIGS[name]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 virtual_pipeline_model_parallel_size=vpp, expert_model_parallel_size=ep,
                                 expert_tensor_parallel_size=etp, order=extra.get("order", "tp-cp-ep-dp-pp"))
    config = build_config(dims, layers, tp, pp, vpp, ep, etp, extra)
    params: dict[str, list] = {}
    buffers: dict[str, list] = {}
    for chunk in range(vpp or 1):
        vp_stage = chunk if vpp else None
        prefix = f"model{chunk}." if vpp else ""
        block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, vp_stage=vp_stage)
        if dims.get("mla"):
            for layer_spec in block.layer_specs:
                layer_spec.submodules.self_attention.submodules.core_attention = MlaCoreAttention
        mtp = (get_gpt_mtp_block_spec(config, block.layer_specs[-1], use_transformer_engine=False,
                                      vp_stage=vp_stage) if extra.get("mtp") else None)
        model = GPTModel(config, block, vocab_size=padded_vocab(dims["vocab"], tp, spec), max_sequence_length=64,
                         pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                         post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                         share_embeddings_and_output_weights=bool(extra.get("tie")),
                         position_embedding_type="rope", mtp_block_spec=mtp, vp_stage=vp_stage)
        built = {n: dtype_name(t) for n, t in model.named_parameters()}
        built_buffers = {n: dtype_name(t) for n, t in model.named_buffers()}
        # a bf16 job holds the model wrapped as Megatron's training loops (and Megatron-Bridge's get_model)
        # wrap it: Float16Module casts every parameter and buffer to bf16; the router's first forward turns
        # expert_bias back to fp32 (TopKRouter._maintain_float32_expert_bias)
        wrapped = Float16Module(config, model).module
        for m in wrapped.modules():
            if hasattr(m, "_maintain_float32_expert_bias"):
                m._maintain_float32_expert_bias()
        persistent = set(wrapped.state_dict(keep_vars=True))
        for n, t in wrapped.named_parameters():
            params[prefix + n] = {"shape": list(t.shape), "dtype": dtype_name(t), "built_dtype": built[n]}
        for n, t in wrapped.named_buffers():
            buffers[prefix + n] = {"shape": list(t.shape), "dtype": dtype_name(t), "built_dtype": built_buffers[n],
                                   "persistent": n in persistent}
    coords = {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
              "dp": ps.get_data_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
              "etp": ps.get_expert_tensor_parallel_rank()}
    Path(out_dir, f"{rank}.json").write_text(json.dumps({"coords": coords, "params": params, "buffers": buffers}))
    dist.barrier()
    dist.destroy_process_group()


def world_size(name: str) -> int:
    spec, tp, pp = CONFIGS[name][2], CONFIGS[name][5], CONFIGS[name][6]
    dp = 1
    for kv in spec.split(","):
        k, _, v = kv.partition("=")
        if k == "dp":
            dp = int(v)
    return tp * pp * dp


def generate(name: str) -> None:
    import megatron.core

    builder, bkw, spec, dims, layers, tp, pp, vpp, ep, etp, extra = CONFIGS[name]
    world = world_size(name)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(world, name, os.path.join(tmp, "init"), tmp), nprocs=world, join=True)
        ranks = [json.loads(Path(tmp, f"{r}.json").read_text()) for r in range(world)]
    doc = {"megatron_core": megatron.core.__version__, "torch": torch.__version__, "layer_spec": "local",
           "wrapped": "Float16Module (bf16)",
           "builder": builder, "builder_kwargs": bkw, "parallel": spec, "dims": dims, "layers": layers,
           "sizes": {"tp": tp, "pp": pp, "vpp": vpp, "ep": ep, "etp": etp}, "extra": extra, "ranks": ranks}
    (HERE / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{name}: {world} ranks, {sum(len(r['params']) for r in ranks)} parameters")


if __name__ == "__main__":
    for n in sys.argv[1:] or list(CONFIGS):
        generate(n)
