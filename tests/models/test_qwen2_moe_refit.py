"""One real refit of a small Qwen2-MoE (engineer "archs1"): gloo processes move the bytes from a Megatron
layout (tp 2, ep 2: q/k/v biases in linear_qkv, the shared expert split by tp, its gate replicated) to a vLLM
one (tp 2, engines), verify every tensor's checksum on the inference side and commit; `verified` is the
runtime's verdict that the inference ranks hold bit-exactly the trainer's weights."""

from __future__ import annotations

import json

from reshardctl.cli import main

SMALL_QWEN2_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1, "mlp_only_layers": [0], "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_qwen2_moe_refit_is_verified(tmp_path, capsys):
    cfg = tmp_path / "model" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(SMALL_QWEN2_MOE))
    out = tmp_path / "run"
    rc = main(["run", "--model", str(cfg), "--train", "tp=2,ep=2", "--infer", "tp=2,dp_mode=engines", "--iters", "1",
               "--transport", "reshard", "--timeout-s", "60", "--out", str(out), "--json"])
    text = capsys.readouterr().out
    assert rc == 0, text[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    s = summary["transports"]["reshard"]
    assert s["verified"] is True and not s["failures"] and s["bytes_needed"] > 0
    assert summary["request"]["model"] == str(cfg)
