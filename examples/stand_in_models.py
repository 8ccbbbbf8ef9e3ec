"""Stand-ins for the frameworks' own models, so that examples/refit_loop.py runs from a fresh clone.

A real job binds megatron-core's ``GPTModel`` and vLLM's ``LlamaForCausalLM``; neither runs here, so
these build ``nn.Module``s with the same parameter names and shapes for a dense Llama-style config at
tensor parallel size ``tp`` (pipeline, experts: see docs/bindings.md). Written from the frameworks'
rules, not from reshardctl's layout code, so the example's reference check is independent of it:

* megatron-core, Transformer Engine spec (megatron/core/models/gpt/gpt_layer_specs.py): ``linear_qkv``
  rows interleaved per query group ``[q heads of g | k_g | v_g]`` and split contiguously over TP;
  ``linear_fc1 = [gate_r; up_r]``; row-parallel ``linear_proj``/``linear_fc2`` split by columns;
  vocabulary rows ``V/tp`` (Megatron-Bridge: unpadded); norms fused into the next linear.
* vLLM (model_executor/models/llama.py, layers/linear.py, layers/vocab_parallel_embedding.py):
  ``qkv_proj = [q_r | k_r | v_r]`` with kv heads replicated when tp > kv heads; ``gate_up_proj =
  [gate_r; up_r]``; vocabulary padded to a multiple of 64, then split by TP.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def _module(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> nn.Module:
    """An ``nn.Module`` whose ``named_parameters()`` are exactly ``shapes`` (dotted names)."""
    root = nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, nn.Module())
            node = getattr(node, part)
        node.register_parameter(leaf, nn.Parameter(torch.empty(shape, dtype=dtype)))
    return root


def _dims(config: dict) -> tuple[int, int, int, int, int, int, int]:
    h, nh = config["hidden_size"], config["num_attention_heads"]
    nkv = config.get("num_key_value_heads", nh)
    hd = config.get("head_dim") or h // nh
    return h, nh, nkv, hd, config["intermediate_size"], config["vocab_size"], config["num_hidden_layers"]


def reference_weights(config: dict, step: int) -> dict[str, torch.Tensor]:
    """The full Hugging Face tensors "the trainer produced" at ``step``: deterministic, so every
    process can compute them on its own (the inference side checks against them)."""
    h, nh, nkv, hd, inter, vocab, layers = _dims(config)
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (nh * hd, h), p + "self_attn.k_proj.weight": (nkv * hd, h),
                       p + "self_attn.v_proj.weight": (nkv * hd, h), p + "self_attn.o_proj.weight": (h, nh * hd),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
    out = {}
    for name, shape in shapes.items():
        seed = int.from_bytes(hashlib.blake2b(f"{name}@{step}".encode(), digest_size=8).digest(), "little") >> 1
        g = torch.Generator().manual_seed(seed)
        out[name] = torch.randn(shape, generator=g).to(torch.bfloat16)
    return out


class MegatronGPT:
    """megatron-core ``GPTModel`` names and shapes (TE spec) on TP rank ``rank`` of ``tp``."""

    def __init__(self, config: dict, tp: int, rank: int):
        h, nh, nkv, hd, inter, vocab, layers = _dims(config)
        self.config, self.tp, self.rank = config, tp, rank
        shapes = {"embedding.word_embeddings.weight": (vocab // tp, h), "decoder.final_layernorm.weight": (h,),
                  "output_layer.weight": (vocab // tp, h)}
        for i in range(layers):
            p = f"decoder.layers.{i}."
            shapes.update({p + "self_attention.linear_qkv.layer_norm_weight": (h,),
                           p + "self_attention.linear_qkv.weight": ((nh + 2 * nkv) * hd // tp, h),
                           p + "self_attention.linear_proj.weight": (h, nh * hd // tp),
                           p + "mlp.linear_fc1.layer_norm_weight": (h,),
                           p + "mlp.linear_fc1.weight": (2 * inter // tp, h),
                           p + "mlp.linear_fc2.weight": (h, inter // tp)})
        self.module = _module(shapes, torch.bfloat16)

    def train_step(self, full: dict[str, torch.Tensor]) -> None:
        """Stand-in for an optimizer step: this rank's shards of ``full``, written in place."""
        h, nh, nkv, hd, inter, vocab, layers = _dims(self.config)
        r, tp = self.rank, self.tp

        def rows(t, n):  # contiguous TP split of dim 0
            return t.chunk(tp, 0)[r] if n else t

        qpg = nh // nkv
        new = {"embedding.word_embeddings.weight": rows(full["model.embed_tokens.weight"], 1),
               "decoder.final_layernorm.weight": full["model.norm.weight"],
               "output_layer.weight": rows(full["lm_head.weight"], 1)}
        for i in range(layers):
            p, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
            q = full[hf + "self_attn.q_proj.weight"].view(nkv, qpg * hd, h)
            k = full[hf + "self_attn.k_proj.weight"].view(nkv, hd, h)
            v = full[hf + "self_attn.v_proj.weight"].view(nkv, hd, h)
            qkv = torch.cat([q, k, v], 1).reshape(-1, h)  # per query group [q of g | k_g | v_g]
            new.update({p + "self_attention.linear_qkv.layer_norm_weight": full[hf + "input_layernorm.weight"],
                        p + "self_attention.linear_qkv.weight": rows(qkv, 1),
                        p + "self_attention.linear_proj.weight": full[hf + "self_attn.o_proj.weight"].chunk(tp, 1)[r],
                        p + "mlp.linear_fc1.layer_norm_weight": full[hf + "post_attention_layernorm.weight"],
                        p + "mlp.linear_fc1.weight": torch.cat([rows(full[hf + "mlp.gate_proj.weight"], 1),
                                                                rows(full[hf + "mlp.up_proj.weight"], 1)]),
                        p + "mlp.linear_fc2.weight": full[hf + "mlp.down_proj.weight"].chunk(tp, 1)[r]})
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                p.copy_(new[name])


class VllmLlama:
    """vLLM ``LlamaForCausalLM`` names and shapes on TP rank ``rank`` of ``tp``."""

    PAD = 64  # vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE

    def __init__(self, config: dict, tp: int, rank: int):
        h, nh, nkv, hd, inter, vocab, layers = _dims(config)
        self.config, self.tp, self.rank = config, tp, rank
        padded = -(-vocab // self.PAD) * self.PAD
        kvh = max(1, nkv // tp)
        shapes = {"model.embed_tokens.weight": (padded // tp, h), "model.norm.weight": (h,),
                  "lm_head.weight": (padded // tp, h)}
        for i in range(layers):
            p = f"model.layers.{i}."
            shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                           p + "self_attn.qkv_proj.weight": ((nh // tp + 2 * kvh) * hd, h),
                           p + "self_attn.o_proj.weight": (h, nh * hd // tp),
                           p + "mlp.gate_up_proj.weight": (2 * inter // tp, h),
                           p + "mlp.down_proj.weight": (h, inter // tp)})
        self.module = _module(shapes, torch.bfloat16)
        with torch.no_grad():
            for p in self.module.parameters():
                p.zero_()

    def expected(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What every parameter must hold after a refit of ``full`` (padding rows: untouched, zero)."""
        h, nh, nkv, hd, inter, vocab, layers = _dims(self.config)
        r, tp = self.rank, self.tp
        per_vocab = self.module.model.embed_tokens.weight.shape[0]
        replicas = max(1, tp // nkv)
        kvh = max(1, nkv // tp)

        def vocab_rows(t):
            out = torch.zeros(per_vocab, h, dtype=t.dtype)
            part = t[r * per_vocab:(r + 1) * per_vocab]
            out[:part.shape[0]] = part
            return out

        exp = {"model.embed_tokens.weight": vocab_rows(full["model.embed_tokens.weight"]),
               "model.norm.weight": full["model.norm.weight"], "lm_head.weight": vocab_rows(full["lm_head.weight"])}
        for i in range(layers):
            p = f"model.layers.{i}."
            kv0 = (r // replicas) * kvh * hd
            exp.update({p + "input_layernorm.weight": full[p + "input_layernorm.weight"],
                        p + "post_attention_layernorm.weight": full[p + "post_attention_layernorm.weight"],
                        p + "self_attn.qkv_proj.weight": torch.cat([
                            full[p + "self_attn.q_proj.weight"].chunk(tp, 0)[r],
                            full[p + "self_attn.k_proj.weight"][kv0:kv0 + kvh * hd],
                            full[p + "self_attn.v_proj.weight"][kv0:kv0 + kvh * hd]]),
                        p + "self_attn.o_proj.weight": full[p + "self_attn.o_proj.weight"].chunk(tp, 1)[r],
                        p + "mlp.gate_up_proj.weight": torch.cat([full[p + "mlp.gate_proj.weight"].chunk(tp, 0)[r],
                                                                  full[p + "mlp.up_proj.weight"].chunk(tp, 0)[r]]),
                        p + "mlp.down_proj.weight": full[p + "mlp.down_proj.weight"].chunk(tp, 1)[r]})
        return exp

    def matches(self, full: dict[str, torch.Tensor]) -> list[str]:
        """The parameters that differ from ``expected(full)``, bit for bit (empty: verified)."""
        exp = self.expected(full)
        return [n for n, p in self.module.named_parameters()
                if not torch.equal(p.detach().view(torch.int16), exp[n].view(torch.int16))]
