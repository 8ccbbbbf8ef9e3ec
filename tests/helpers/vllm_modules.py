"""vLLM's own parameters on one rank of a vLLM deployment, and vLLM's weight loaders, for the layout tests.

Written from vLLM's source (the vLLM 0.33.0 wheel for the dp modes, the sequence-parallel backends and the
pipeline copies; before that ``vllm-project/vllm`` main as stored in the code index, late 2025 - 2026:
``vllm/model_executor/layers/fused_moe/expert_map_manager.py`` at 04d26335ddf7, ``fused_moe/layer.py`` at
0014ec6c58e1 (``make_expert_params_mapping``), ``models/deepseek_v2.py`` (router bias), the rest as named
per rule below), independently of ``reshardctl.layout`` (nothing here imports it): a test compares the two.
The rules cited have been stable across the versions read (0.14.1 to 0.33.0).

``vllm_params(model, dep, rank)``: ``{name: (shape, dtype)}`` of what ``named_parameters()`` yields on that
rank (the MTP draft model, a separate module next to the target on the last pipeline stage, under
``draft/``). ``vllm_module`` builds an ``nn.Module`` with exactly those names. ``load_like_vllm`` fills
the parameters from full HF tensors the way vLLM's ``weight_loader``\\ s do (narrow + copy, padding rows 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from reshardctl.models.spec import ModelSpec

PAD = 64  # vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE = 64; pad_vocab_size rounds up to it

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16, "float64": torch.float64}


# The all2all backends' rules, per vLLM release, as each wheel's source states them (PyPI wheels 0.14.1, 0.29.0,
# 0.33.0), independently of reshardctl/layout/vllm_versions.py:
# - config/parallel.py ParallelConfig._validate_parallel_config (0.33.0 :537-543, 0.29.0 :488-494): "naive" and
#   "pplx" "have been removed", the config then holds "allgather_reducescatter" (0.14.1 keeps them);
# - config/parallel.py use_sequence_parallel_moe (0.33.0 :768-785, 0.29.0 :704-719, 0.14.1 :429-441): the backend
#   in the list below and enable_expert_parallel and tensor_parallel_size > 1 and data_parallel_size > 1;
# - fused_moe/config.py use_all2all_kernels (0.33.0 :1035-1038): use_ep and (dp_size > 1 or pcp_size > 1 or
#   sp_size > 1); expert_map_manager.py determine_expert_placement_strategy (0.33.0 :137-147): round_robin kept
#   with all2all kernels only where needs_round_robin_routing_tables (config.py :1070-1071: deepep_low_latency,
#   nixl_ep kernels; 0.14.1 fused_moe/layer.py:200-210: deepep_low_latency only).
A2A_REMOVED = {"0.14": frozenset(), "0.29": frozenset({"naive", "pplx"}), "0.33": frozenset({"naive", "pplx"})}
A2A_SEQUENCE_PARALLEL = {
    "0.14": ("allgather_reducescatter", "naive", "deepep_high_throughput", "deepep_low_latency"),
    "0.29": ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "flashinfer_nvlink_one_sided",
             "mori_high_throughput", "mori_low_latency", "nixl_ep"),
    "0.33": ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
             "flashinfer_nvlink_one_sided", "passthrough", "mori_high_throughput", "mori_low_latency", "nixl_ep"),
}
A2A_ROUND_ROBIN_TABLES = {"0.14": ("deepep_low_latency",), "0.29": ("deepep_low_latency", "nixl_ep"),
                          "0.33": ("deepep_low_latency", "nixl_ep")}


@dataclass(frozen=True)
class Deployment:
    """One vLLM engine: ``tp``, ``pp``, in-engine ``dp``; ``expert_parallel`` (--enable-expert-parallel),
    ``placement`` (--expert-placement-strategy), EPLB ``redundant`` slots, an EPLB physical->logical map,
    ``all2all`` (--all2all-backend, default ``allgather_reducescatter``: config/parallel.py:220 in 0.33.0) and
    the vLLM release ``vllm`` whose rules apply."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    expert_parallel: bool = False
    placement: str = "linear"
    redundant: int = 0
    phys_map: tuple[int, ...] | None = None
    all2all: str = "allgather_reducescatter"
    vllm: str = "0.33"

    @property
    def backend(self) -> str:
        """The backend the engine runs (after _validate_parallel_config's fallback)."""
        return "allgather_reducescatter" if self.all2all in A2A_REMOVED[self.vllm] else self.all2all

    @property
    def sequence_parallel_moe(self) -> bool:
        return (self.backend in A2A_SEQUENCE_PARALLEL[self.vllm] and self.expert_parallel and self.tp > 1
                and self.dp > 1)

    @property
    def all2all_kernels(self) -> bool:
        """FusedMoEParallelConfig: use_ep = (dp*tp > 1 and expert parallel); then dp > 1 or sequence parallel."""
        return self.expert_parallel and self.dp * self.tp > 1 and (self.dp > 1 or self.sequence_parallel_moe)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp): parallel_state.initialize_model_parallel builds
        ``torch.arange(world).reshape(-1, dp, pp, tp)``: TP innermost, then PP, then DP."""
        return rank // (self.tp * self.pp), (rank // self.tp) % self.pp, rank % self.tp

    def spec(self, map_file: str | None = None) -> str:
        """The same deployment as a reshardctl ``--infer`` spec."""
        s = f"tp={self.tp},pp={self.pp},dp={self.dp}"
        if self.dp > 1:  # one engine with vLLM's own DP (reshardctl's default is an engine per replica)
            s += ",dp_mode=in_engine"
        if self.expert_parallel:
            s += ",expert_parallel=true"
            if self.placement != "linear":
                s += f",placement={self.placement}"
            if self.redundant:
                s += f",redundant={self.redundant}"
            if map_file:
                s += f",expert_map={map_file}"
        if self.all2all != "allgather_reducescatter":
            s += f",all2all={self.all2all}"
        if self.vllm != "0.33":
            s += f",vllm={self.vllm}"
        return s


def pp_indices(num_layers: int, pp_rank: int, pp: int) -> range:
    """distributed/utils.py get_pp_indices: ``[L // pp] * pp``, the remainder added to the partitions just
    before the last (``for i in range(2, remaining_layers + 2): partitions[-i] += 1``)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    start = sum(parts[:pp_rank])
    return range(start, start + parts[pp_rank])


def initial_phys_map(num_experts: int, redundant: int) -> tuple[int, ...]:
    """eplb_state.py EplbState.build_initial_global_physical_to_logical_map:
    ``list(range(E)) + [i % E for i in range(R)]``."""
    return tuple(range(num_experts)) + tuple(i % num_experts for i in range(redundant))


def local_experts(model: ModelSpec, dep: Deployment, ep_rank: int, ep_size: int) -> list[int]:
    """The logical expert at each local slot of ``w13_weight`` / ``w2_weight`` on EP rank ``ep_rank``.

    FusedMoE: ``global_num_experts = E + num_redundant_experts`` (physical ids). expert_map_manager.py
    determine_expert_map: ``base, rem = divmod(global, ep)``; ``local = base + 1 if ep_rank < rem``;
    linear: physical ``[ep_rank*base + min(ep_rank, rem), + local)``; round_robin:
    ``arange(ep_rank, global, ep)``. determine_expert_placement_strategy: round_robin only with
    ``num_expert_group > 1``, no redundant experts, no EPLB, and either no all2all kernels or a backend with
    round-robin routing tables (``A2A_ROUND_ROBIN_TABLES``); else linear. layer.py make_expert_params_mapping:
    physical slot ``p`` loads the checkpoint's ``experts.{physical_to_logical_map[p]}``."""
    E = model.dims.num_experts
    R = dep.redundant if dep.phys_map is None else len(dep.phys_map) - E
    phys = dep.phys_map if dep.phys_map is not None else initial_phys_map(E, R)
    n = len(phys)
    if ep_size == 1:
        return list(phys)
    placement = dep.placement
    tables = dep.backend in A2A_ROUND_ROBIN_TABLES[dep.vllm]
    if placement == "round_robin" and (int(model.config.get("n_group") or 1) <= 1 or R or dep.phys_map
                                       or dep.all2all_kernels and not tables):
        placement = "linear"
    base, rem = divmod(n, ep_size)
    count = base + (1 if ep_rank < rem else 0)
    if placement == "round_robin":
        ids = list(range(ep_rank, n, ep_size))
    else:
        start = ep_rank * base + min(ep_rank, rem)
        ids = list(range(start, start + count))
    assert len(ids) == count
    return [phys[p] for p in ids]


# --------------------------------------------------------------------------- loaders
# A loader fills a local parameter from one full HF tensor (``shard``: which part of a fused parameter).
Loader = Callable[[torch.Tensor, torch.Tensor, object], None]


def replicated() -> Loader:
    """ReplicatedLinear / RMSNorm / nn.Linear / nn.Parameter: the whole tensor."""
    def load(p, w, shard):
        p.copy_(w)
    return load


def column(rank: int) -> Loader:
    """linear.py ColumnParallelLinear.weight_loader: ``narrow(output_dim=0, tp_rank * shard_size, shard_size)``."""
    def load(p, w, shard):
        n = p.shape[0]
        p.copy_(w.narrow(0, rank * n, n))
    return load


def row(rank: int) -> Loader:
    """linear.py RowParallelLinear.weight_loader: ``narrow(input_dim=1, tp_rank * shard_size, shard_size)``."""
    def load(p, w, shard):
        n = p.shape[1]
        p.copy_(w.narrow(1, rank * n, n))
    return load


def merged(parts: list[int], rank: int) -> Loader:
    """linear.py MergedColumnParallelLinear.weight_loader: shard ``i`` (local size ``parts[i] = size_i // tp``)
    at rows ``sum(parts[:i])``, from ``loaded.narrow(0, tp_rank * parts[i], parts[i])`` (``disable_tp``: rank
    0). A block-fp8 ``weight_scale_inv`` the same in blocks: ``(shard_offset + block_n - 1) // block_n``."""
    def load(p, w, shard):
        off, n = sum(parts[:shard]), parts[shard]
        p[off:off + n].copy_(w.narrow(0, rank * n, n))
    return load


def qkv(parts: list[int], rank: int, reps: int) -> Loader:
    """linear.py QKVParallelLinear: ``num_heads = nh / tp``; ``tp >= nkv``: ``num_kv_heads = 1``,
    ``num_kv_head_replicas = tp / nkv``, else ``nkv / tp`` and 1; weight_loader: q at 0, k at
    ``num_heads*hd``, v at ``(num_heads + num_kv_heads)*hd`` (``parts``: local q, k, v rows); the shard
    index is ``tp_rank`` for q and ``tp_rank // num_kv_head_replicas`` for k and v;
    ``start_idx = shard_id * shard_size``."""
    def load(p, w, shard):
        i = "qkv".index(shard)
        off, n = sum(parts[:i]), parts[i]
        p[off:off + n].copy_(w.narrow(0, (rank if shard == "q" else rank // reps) * n, n))
    return load


def vocab(vocab_size: int, tp: int, rank: int) -> Loader:
    """vocab_parallel_embedding.py VocabParallelEmbedding: ``org_vocab_size_padded = pad_vocab_size(V, 64)``,
    ``num_embeddings_per_partition = divide(padded, tp)``; _get_indices / vocab_range_from_global_vocab_size:
    rank r holds ``[r*per, min((r+1)*per, V))``; weight_loader: ``param[:n].copy_(loaded.narrow(0, start, n))``,
    ``param[n:].fill_(0)``."""
    def load(p, w, shard):
        per = p.shape[0]
        start = rank * per
        n = max(0, min(start + per, vocab_size) - start)
        p[:n].copy_(w.narrow(0, start, n))
        p[n:].fill_(0)
    return load


def experts(slots: list[int], tp_rank: int) -> Loader:
    """fused_moe/layer.py FusedMoE.weight_loader: the physical id -> local slot by ``expert_map`` (-1: not
    here); _load_w13: ``shard_size = expert_data.shape[1] // 2``, w1 (gate) rows ``[0, shard_size)``, w3
    (up) ``[shard_size, 2*shard_size)``, each ``loaded.narrow(0, shard_size * tp_rank, shard_size)``;
    _load_w2: ``narrow(1, shard_size * tp_rank, shard_size)`` (block-fp8 scales alike, in blocks).
    ``shard = (logical expert, "w1" | "w2" | "w3")``; every local slot holding that expert is loaded."""
    def load(p, w, shard):
        e, sid = shard
        for k, logical in enumerate(slots):
            if logical != e:
                continue
            if sid == "w2":
                n = p.shape[2]
                p[k].copy_(w.narrow(1, tp_rank * n, n))
            else:
                n = p.shape[1] // 2
                off = 0 if sid == "w1" else n
                p[k, off:off + n].copy_(w.narrow(0, tp_rank * n, n))
    return load


# --------------------------------------------------------------------------- parameters of one rank
@dataclass(frozen=True)
class VParam:
    shape: tuple[int, ...]
    dtype: str
    loader: Loader


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class _Linears:
    """Adds a vLLM LinearBase layer's parameters: ``weight`` ``[sum(parts), cols]`` (local sizes) and, with a
    block-fp8 checkpoint, ``weight_scale_inv`` float32 ``[ceil(sum(parts)/block_n), ceil(cols/block_k)]``
    (quantization/fp8.py Fp8LinearMethod.create_weights, BlockQuantScaleParameter), the weight then
    float8_e4m3fn. ``make(parts)`` builds the loader for partitions of those local sizes."""

    def __init__(self, out: dict[str, VParam], dt: str, block: tuple[int, int] | None):
        self.out, self.dt, self.block = out, dt, block

    def add(self, prefix: str, parts: list[int], cols: int, make, quantized: bool = True) -> None:
        fp8 = quantized and self.block is not None
        self.out[prefix + "weight"] = VParam((sum(parts), cols), "float8_e4m3fn" if fp8 else self.dt, make(parts))
        if fp8:
            bn, bk = self.block
            sparts = [_ceil(x, bn) for x in parts]
            self.out[prefix + "weight_scale_inv"] = VParam((_ceil(sum(parts), bn), _ceil(cols, bk)), "float32",
                                                           make(sparts))


def _layer_params(model: ModelSpec, dep: Deployment, rank: int, layer: int, pre: str, dt: str,
                  out: dict[str, VParam]) -> None:
    """One decoder layer (LlamaDecoderLayer, Qwen3MoeDecoderLayer, DeepseekV2DecoderLayer) at ``pre``."""
    d = model.dims
    dpr, _, tpr = dep.coords(rank)
    TP, H = dep.tp, d.hidden
    block = fp8_block(model)
    lin = _Linears(out, dt, block)
    col, rw, rep = (lambda parts: column(tpr)), (lambda parts: row(tpr)), (lambda parts: replicated())
    a = pre + "self_attn."
    out[pre + "input_layernorm.weight"] = VParam((H,), dt, replicated())
    out[pre + "post_attention_layernorm.weight"] = VParam((H,), dt, replicated())
    if d.kv_lora_rank:  # deepseek_v2.py DeepseekV2MLAAttention
        qk = d.qk_nope_head_dim + d.qk_rope_head_dim
        h = d.num_heads // TP
        kva = d.kv_lora_rank + d.qk_rope_head_dim
        if d.q_lora_rank:  # fused_qkv_a_proj = MergedColumnParallelLinear(H, [q_lora, kv_lora + rope], disable_tp)
            lin.add(a + "fused_qkv_a_proj.", [d.q_lora_rank, kva], H, lambda parts: merged(parts, 0))
            out[a + "q_a_layernorm.weight"] = VParam((d.q_lora_rank,), dt, replicated())
            lin.add(a + "q_b_proj.", [h * qk], d.q_lora_rank, col)  # ColumnParallelLinear
        else:  # q_proj = ColumnParallelLinear; kv_a_proj_with_mqa = ReplicatedLinear
            lin.add(a + "q_proj.", [h * qk], H, col)
            lin.add(a + "kv_a_proj_with_mqa.", [kva], H, rep)
        out[a + "kv_a_layernorm.weight"] = VParam((d.kv_lora_rank,), dt, replicated())
        lin.add(a + "kv_b_proj.", [h * (d.qk_nope_head_dim + d.v_head_dim)], d.kv_lora_rank, col)
        lin.add(a + "o_proj.", [H], h * d.v_head_dim, rw)  # RowParallelLinear
    else:  # llama.py LlamaAttention / qwen3_moe.py Qwen3MoeAttention: QKVParallelLinear + RowParallelLinear
        nh, nkv, hd = d.num_heads, d.num_kv_heads, d.head_dim
        kvh, reps = (1, TP // nkv) if TP >= nkv else (nkv // TP, 1)
        lin.add(a + "qkv_proj.", [nh // TP * hd, kvh * hd, kvh * hd], H, lambda parts: qkv(parts, tpr, reps))
        lin.add(a + "o_proj.", [H], nh // TP * hd, rw)
        if d.arch.startswith("qwen3"):  # Qwen3MoeAttention: q_norm, k_norm = RMSNorm(head_dim)
            out[a + "q_norm.weight"] = VParam((hd,), dt, replicated())
            out[a + "k_norm.weight"] = VParam((hd,), dt, replicated())
    m = pre + "mlp."
    if layer not in d.moe_layers:  # LlamaMLP / DeepseekV2MLP: gate_up_proj (merged column), down_proj (row)
        i = d.intermediate // TP
        lin.add(m + "gate_up_proj.", [i, i], H, lambda parts: merged(parts, tpr))
        lin.add(m + "down_proj.", [H], i, rw)
        return
    E, Im = d.num_experts, d.moe_intermediate
    # ReplicatedLinear(H, E) router, built with quant_config=None (deepseek_v2.py DeepseekV2MoE, qwen3_moe.py)
    lin.add(m + "gate.", [E], H, rep, quantized=False)
    if d.arch == "deepseek_v3":  # deepseek_v2.py: gate.e_score_correction_bias = nn.Parameter(empty(E, float32))
        out[m + "gate.e_score_correction_bias"] = VParam((E,), "float32", replicated())
    # fused_moe/config.py FusedMoEParallelConfig.make: the MoE world is flattened over DP x TP; with EP,
    # ep = dp*tp (ep_rank = dp_rank*tp + tp_rank) and moe tp = 1; without, moe tp = dp*tp.
    flat, flat_rank = dep.dp * TP, dpr * TP + tpr
    if dep.expert_parallel:  # (a world of one: ep 1, all E + R physical slots local)
        slots, i_tp, mtp_rank = local_experts(model, dep, flat_rank, flat), Im, 0
    else:
        slots, i_tp, mtp_rank = list(range(E)), Im // flat, flat_rank
    # unquantized_fused_moe_method.py create_weights: w13 [E_local, 2*I_tp, H], w2 [E_local, H, I_tp];
    # quantization/fp8.py Fp8MoEMethod.create_weights (block): w13_weight_scale_inv
    # [E_local, 2 * ceil(I_tp / block_n), ceil(H / block_k)], w2_weight_scale_inv [E_local, ceil(H / block_n),
    # ceil(I_tp / block_k)], float32; the weights float8_e4m3fn
    n = len(slots)
    wdt = "float8_e4m3fn" if block else dt
    out[m + "experts.w13_weight"] = VParam((n, 2 * i_tp, H), wdt, experts(slots, mtp_rank))
    out[m + "experts.w2_weight"] = VParam((n, H, i_tp), wdt, experts(slots, mtp_rank))
    if block:
        bn, bk = block
        out[m + "experts.w13_weight_scale_inv"] = VParam((n, 2 * _ceil(i_tp, bn), _ceil(H, bk)), "float32",
                                                         experts(slots, mtp_rank))
        out[m + "experts.w2_weight_scale_inv"] = VParam((n, _ceil(H, bn), _ceil(i_tp, bk)), "float32",
                                                        experts(slots, mtp_rank))
    if d.num_shared_experts:
        # DeepseekV2MoE (0.33.0 deepseek_v2.py:312, :364-371): shared_experts = DeepseekV2MLP(I * n_shared,
        # is_sequence_parallel=ParallelConfig.use_sequence_parallel_moe), whose gate_up_proj / down_proj take
        # disable_tp=is_sequence_parallel (:244-275): whole on every rank, else TP-split like a dense MLP
        st, sr = (1, 0) if dep.sequence_parallel_moe else (TP, tpr)
        si = Im * d.num_shared_experts // st
        lin.add(m + "shared_experts.gate_up_proj.", [si, si], H, lambda parts: merged(parts, sr))
        lin.add(m + "shared_experts.down_proj.", [H], si, lambda parts: row(sr))


def fp8_block(model: ModelSpec) -> tuple[int, int] | None:
    """``quantization_config.weight_block_size`` (DeepSeek-V3: [128, 128]) when the checkpoint is block fp8
    (it has ``weight_scale_inv`` tensors)."""
    if not any(t.name.endswith("weight_scale_inv") for t in model.tensors):
        return None
    bs = (model.config.get("quantization_config") or {}).get("weight_block_size") or (128, 128)
    return int(bs[0]), int(bs[1])


def vllm_param_table(model: ModelSpec, dep: Deployment, rank: int) -> dict[str, VParam]:
    """Every parameter of one rank, with its loader. The draft (MTP) model's under ``draft/``."""
    d = model.dims
    _, ppr, tpr = dep.coords(rank)
    first, last = ppr == 0, ppr == dep.pp - 1
    dt = "bfloat16"
    padded = -(-d.vocab // PAD) * PAD
    emb = VParam((padded // dep.tp, d.hidden), dt, vocab(d.vocab, dep.tp, tpr))
    out: dict[str, VParam] = {}
    # llama.py LlamaModel.__init__: embed_tokens on the first PP rank, or tied and the last; else PPMissingLayer.
    # vLLM 0.33.0 qwen3_moe.py:468/:479 Qwen3MoeModel.__init__ builds embed_tokens and norm on every PP rank,
    # :580 Qwen3MoeForCausalLM.__init__ lm_head too (no PPMissingLayer for them): they are on every stage; so do
    # qwen2_moe.py:372/:388/:462 and mixtral.py:316/:336/:406 (0.33.0)
    every = d.arch in ("qwen3_moe", "qwen2_moe", "mixtral")
    if first or (d.tie_embeddings and last) or every:
        out["model.embed_tokens.weight"] = emb
    # make_layers(num_hidden_layers, ...): layers outside get_pp_indices are PPMissingLayer (no parameters),
    # the others keep their global index in ``model.layers.{i}``
    for layer in pp_indices(d.num_layers, ppr, dep.pp):
        _layer_params(model, dep, rank, layer, f"model.layers.{layer}.", dt, out)
    if last or every:
        out["model.norm.weight"] = VParam((d.hidden,), dt, replicated())  # last rank's RMSNorm
        if not d.tie_embeddings:  # LlamaForCausalLM: ParallelLMHead on the last rank; tied: the same Parameter
            out["lm_head.weight"] = emb  # (named_parameters() yields it once, as model.embed_tokens.weight)
    if last:
        # the MTP draft (deepseek_mtp.py DeepSeekMTP) is built by the drafter on the last PP rank only
        for k in range(d.num_mtp_layers):
            layer = d.num_layers + k
            p = f"draft/model.layers.{layer}."
            out["draft/model.embed_tokens.weight"] = emb  # DeepSeekMultiTokenPredictor.embed_tokens
            out[p + "enorm.weight"] = VParam((d.hidden,), dt, replicated())
            out[p + "hnorm.weight"] = VParam((d.hidden,), dt, replicated())
            out[p + "eh_proj.weight"] = VParam((d.hidden, 2 * d.hidden), dt, replicated())  # nn.Linear(2H, H)
            out[p + "shared_head.norm.weight"] = VParam((d.hidden,), dt, replicated())
            out[p + "shared_head.head.weight"] = emb  # ParallelLMHead
            _layer_params(model, dep, rank, layer, p + "mtp_block.", dt, out)
    return out


def vllm_params(model: ModelSpec, dep: Deployment, rank: int) -> dict[str, tuple[tuple[int, ...], str]]:
    return {n: (p.shape, p.dtype) for n, p in vllm_param_table(model, dep, rank).items()}


def vllm_module(model: ModelSpec, dep: Deployment, rank: int, dtype: torch.dtype | None = None,
                draft: bool = False) -> nn.Module:
    """An ``nn.Module`` whose ``named_parameters()`` are vLLM's on this rank (the target model, or with
    ``draft`` the MTP draft model), ``torch.empty`` in vLLM's dtypes (or ``dtype``)."""
    root = nn.Module()
    for name, p in vllm_param_table(model, dep, rank).items():
        if name.startswith("draft/") != draft:
            continue
        *path, leaf = name.removeprefix("draft/").split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, nn.Module())
            mod = getattr(mod, part)
        t = torch.empty(p.shape, dtype=dtype or DTYPES[p.dtype])
        mod.register_parameter(leaf, nn.Parameter(t, requires_grad=False))
    return root


# --------------------------------------------------------------------------- load_weights
_STACKED = (("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
            ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1),
            ("fused_qkv_a_proj", "q_a_proj", 0), ("fused_qkv_a_proj", "kv_a_proj_with_mqa", 1))


def _target_name(model: ModelSpec, hf: str) -> tuple[str, object]:
    """HF checkpoint name -> (vLLM parameter name, shard id), as the models' load_weights map it:
    ``stacked_params_mapping`` (llama.py, qwen3_moe.py, deepseek_v2.py; ``fused_qkv_a_proj`` only with
    q_lora_rank), ``make_expert_params_mapping`` (``experts.{e}.gate_proj`` -> ``experts.w13_weight`` w1,
    ``up_proj`` -> w3, ``down_proj`` -> ``experts.w2_weight`` w2) and deepseek_mtp.py
    ``_rewrite_spec_layer_name`` (MTP layer ``embed_tokens`` -> ``model.embed_tokens``; not enorm / hnorm /
    eh_proj / shared_head -> ``.mtp_block.``)."""
    d = model.dims
    name = hf
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= d.num_layers:
        pre = ".".join(parts[:3]) + "."
        rest = name[len(pre):]
        if rest.startswith("embed_tokens."):
            name = "draft/model." + rest
        elif rest.split(".")[0] in ("enorm", "hnorm", "eh_proj", "shared_head"):
            name = "draft/" + name
        else:
            name = "draft/" + pre + "mtp_block." + rest
    if ".experts." in name and ".shared_experts." not in name:
        head, tail = name.split(".experts.", 1)
        e, proj, suffix = tail.split(".", 2)  # suffix: weight | weight_scale_inv
        sid = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[proj]
        return f"{head}.experts.{'w2' if sid == 'w2' else 'w13'}_{suffix}", (int(e), sid)
    for param, shard_name, shard in _STACKED:
        if f".{shard_name}." in name:
            if param == "fused_qkv_a_proj" and not d.q_lora_rank or param == "qkv_proj" and d.kv_lora_rank:
                continue  # deepseek_v2.py: no qkv_proj (MLA); fused_qkv_a_proj only with q_lora_rank
            return name.replace(f".{shard_name}.", f".{param}."), shard
    return name, None


def load_like_vllm(model: ModelSpec, dep: Deployment, rank: int, params: dict[str, torch.Tensor],
                   hf: dict[str, torch.Tensor]) -> None:
    """Fill ``params`` (this rank's, by name, draft under ``draft/``) from full HF tensors with vLLM's
    loaders; HF tensors whose parameter is not on this rank are skipped (PPMissingLayer, tied lm_head)."""
    table = vllm_param_table(model, dep, rank)
    with torch.no_grad():
        for hf_name, w in hf.items():
            name, shard = _target_name(model, hf_name)
            if name not in table:
                continue
            table[name].loader(params[name], w, shard)


def apply_segments(lps, hf) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Each parameter zero, then each segment ``param[offset...] = hf[box]``; also how often each element
    was written."""
    vals = {p.name: torch.zeros(p.shape, dtype=torch.float64) for p in lps}
    counts = {p.name: torch.zeros(p.shape, dtype=torch.int32) for p in lps}
    for p in lps:
        for s in p.segments:
            lead = len(s.offset) - len(s.box)
            idx = tuple(s.offset[:lead]) + tuple(slice(o, o + b - a) for o, (a, b) in zip(s.offset[lead:], s.box))
            vals[p.name][idx] = hf[s.hf_name][tuple(slice(a, b) for a, b in s.box)]
            counts[p.name][idx] += 1
    return vals, counts


# --------------------------------------------------------------------------- engineer "archs1": Qwen2, Qwen2-MoE, Mixtral
# Written from vLLM main (vllm/model_executor/models/qwen2_moe.py at 002fb90788ae; qwen2.py; mixtral.py), as edits
# of the table above (which is Llama / Qwen3-MoE / DeepSeek shaped):
# - Qwen2Attention / Qwen2MoeAttention: qkv_proj = QKVParallelLinear(..., bias=True): a ``qkv_proj.bias`` of the
#   weight's local rows, loaded by the same QKV weight_loader (q at 0, k, v after; kv replicas by tp_rank // reps);
# - Qwen2MoeSparseMoeBlock: ``shared_expert`` (singular) = Qwen2MoeMLP(shared_expert_intermediate_size):
#   MergedColumnParallelLinear gate_up_proj + RowParallelLinear down_proj, TP-split always (no disable_tp);
#   ``shared_expert_gate = torch.nn.Linear(H, 1, bias=False)``: replicated, default loader;
# - MixtralDecoderLayer.block_sparse_moe: ``gate`` ReplicatedLinear(H, E), ``experts`` FusedMoE (w13 / w2 as
#   above); make_expert_params_mapping(ckpt_gate_proj_name="w1", ckpt_down_proj_name="w2", ckpt_up_proj_name="w3").
def vllm_param_table_archs1(model: ModelSpec, dep: Deployment, rank: int) -> dict[str, VParam]:
    d = model.dims
    table = vllm_param_table(model, dep, rank)
    _, _, tpr = dep.coords(rank)
    TP = dep.tp
    out: dict[str, VParam] = {}
    for name, p in table.items():
        if d.arch == "mixtral" and (".mlp.gate." in name or ".mlp.experts." in name):
            name = name.replace(".mlp.", ".block_sparse_moe.", 1)
        if d.arch == "qwen2_moe" and ".mlp.shared_experts." in name:
            name = name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")
            si = d.moe_intermediate * d.num_shared_experts // TP  # TP-split even where DeepSeek's is replicated
            p = (VParam((2 * si, d.hidden), p.dtype, merged([si, si], tpr)) if name.endswith("gate_up_proj.weight")
                 else VParam((d.hidden, si), p.dtype, row(tpr)))
        out[name] = p
        if d.arch in ("qwen2", "qwen2_moe") and name.endswith("self_attn.qkv_proj.weight"):
            nh, nkv, hd = d.num_heads, d.num_kv_heads, d.head_dim
            kvh, reps = (1, TP // nkv) if TP >= nkv else (nkv // TP, 1)
            parts = [nh // TP * hd, kvh * hd, kvh * hd]
            out[name[:-len("weight")] + "bias"] = VParam((sum(parts),), p.dtype, qkv(parts, tpr, reps))
        if d.arch == "qwen2_moe" and name.endswith(".mlp.shared_expert.down_proj.weight"):
            out[name.replace("shared_expert.down_proj", "shared_expert_gate")] = VParam((1, d.hidden), p.dtype,
                                                                                      replicated())
    return out


def load_like_vllm_archs1(model: ModelSpec, dep: Deployment, rank: int, params: dict[str, torch.Tensor],
                          hf: dict[str, torch.Tensor]) -> None:
    """load_like_vllm for the archs above: Mixtral's checkpoint names through its expert mapping (w1 -> w13 shard
    w1, w3 -> w13 shard w3, w2 -> w2), the rest as the Llama-style stacked mapping (q/k/v_proj.bias -> qkv_proj.bias,
    shared_expert.gate/up_proj -> shared_expert.gate_up_proj)."""
    table = vllm_param_table_archs1(model, dep, rank)
    ckpt = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
    with torch.no_grad():
        for hf_name, w in hf.items():
            name = hf_name
            if model.dims.arch == "mixtral" and ".block_sparse_moe.experts." in name:
                head, proj, tail = name.rsplit(".", 2)
                name = f"{head.replace('.block_sparse_moe.', '.mlp.')}.{ckpt[proj]}.{tail}"
            target, shard = _target_name(model, name)
            if model.dims.arch == "mixtral":
                target = target.replace(".mlp.experts.", ".block_sparse_moe.experts.")
            if target not in table:
                continue
            table[target].loader(params[target], w, shard)


# --------------------------------------------------------------------------- GLM-4.5 MoE (engineer "archs2")
def glm4_moe_param_table(model: ModelSpec, dep: Deployment, rank: int) -> dict[str, VParam]:
    """vLLM's ``glm4_moe.py`` parameters (read at vllm-project/vllm a4cd9d0d28bd; draft: ``glm4_moe_mtp.py``,
    the same ``_rewrite_spec_layer_name`` as deepseek_mtp.py): the DeepSeek-V2 table above with GLM's
    differences. ``Glm4MoeAttention``: ``QKVParallelLinear(bias=attention_bias)`` -> ``qkv_proj.bias`` with the
    weight's q/k/v partition, ``q_norm``/``k_norm`` RMSNorm(head_dim) when ``use_qk_norm``, plain GQA (no MLA).
    ``Glm4MoE``: ``gate = nn.Linear(H, E, bias=False, dtype=torch.float32)`` and
    ``gate.e_score_correction_bias = nn.Parameter(empty(E, float32))``; ``shared_experts = Glm4MoeMLP(...)``
    (``MergedColumnParallelLinear`` / ``RowParallelLinear`` without ``disable_tp``: TP-split always)."""
    d = model.dims
    assert d.arch == "glm4_moe"
    out = vllm_param_table(model, dep, rank)
    _, ppr, tpr = dep.coords(rank)
    TP, H, nh, nkv, hd = dep.tp, d.hidden, d.num_heads, d.num_kv_heads, d.head_dim
    kvh, reps = (1, TP // nkv) if TP >= nkv else (nkv // TP, 1)
    dt = "bfloat16"
    prefixes = [f"model.layers.{l}." for l in pp_indices(d.num_layers, ppr, dep.pp)]
    if ppr == dep.pp - 1:
        prefixes += [f"draft/model.layers.{d.num_layers + k}.mtp_block." for k in range(d.num_mtp_layers)]
    for pre in prefixes:
        layer = int(pre.split("layers.")[1].split(".")[0])
        a, m = pre + "self_attn.", pre + "mlp."
        parts = [nh // TP * hd, kvh * hd, kvh * hd]
        out[a + "qkv_proj.bias"] = VParam((sum(parts),), dt, qkv(parts, tpr, reps))
        if d.qk_norm:
            out[a + "q_norm.weight"] = VParam((hd,), dt, replicated())
            out[a + "k_norm.weight"] = VParam((hd,), dt, replicated())
        if layer not in d.moe_layers:
            continue
        out[m + "gate.weight"] = VParam((d.num_experts, H), "float32", replicated())
        out[m + "gate.e_score_correction_bias"] = VParam((d.num_experts,), "float32", replicated())
        si = d.moe_intermediate * d.num_shared_experts // TP
        out[m + "shared_experts.gate_up_proj.weight"] = VParam((2 * si, H), dt, merged([si, si], tpr))
        out[m + "shared_experts.down_proj.weight"] = VParam((H, si), dt, row(tpr))
    return out


def load_like_vllm_glm4_moe(model: ModelSpec, dep: Deployment, rank: int, params: dict[str, torch.Tensor],
                            hf: dict[str, torch.Tensor]) -> None:
    """``load_like_vllm`` with :func:`glm4_moe_param_table` (the same name mapping: glm4_moe.py's
    ``stacked_params_mapping`` maps ``q_proj.bias`` to ``qkv_proj.bias`` as it maps the weight)."""
    table = glm4_moe_param_table(model, dep, rank)
    with torch.no_grad():
        for hf_name, w in hf.items():
            name, shard = _target_name(model, hf_name)
            if name in table:
                table[name].loader(params[name], w, shard)
