"""HF ``config.json`` -> :class:`ModelSpec`: the exact tensor inventory of the checkpoint.

The per-architecture tensor tables live in :mod:`reshardctl.models.architectures`; this module reads
the config numbers (every missing or ill-typed key is a :class:`ModelError` naming file and key),
fills :class:`ModelDims` and expands the tables in HF checkpoint order: ``model.embed_tokens``,
layers ``0..L-1`` (each in the fixed block order), ``model.norm``, ``lm_head``, then any MTP layers
(``model.layers.L..``), so the main model is always a prefix of the MTP view.
"""

from __future__ import annotations

from math import ceil, prod
from typing import Any, Mapping

from reshardctl.errors import ModelError
from reshardctl.models.architectures import (
    ARCHS, BY_CLASS, BY_MODEL_TYPE, EMBED, FINAL_NORM, FP8_KINDS, KIND_ROLE, LM_HEAD, MTP_AFTER, MTP_BEFORE, Arch,
    Block, is_expert_block, symbols,
)
from reshardctl.models.spec import ModelDims, ModelSpec, TensorSpec, tensor_spec

_FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")
_MISSING = object()
# Magnitude bounds, checked before any tensor is built (docs/models.md, "Input limits"): every shape and
# byte count stays an exact int64, and `model show` / `plan` answer at once.
MAX_DIM = 1 << 24  # hidden_size, vocab_size, intermediate sizes, heads, head dims, LoRA ranks
MAX_LAYERS = 4096  # num_hidden_layers (+ MTP layers)
MAX_EXPERTS = 65536  # num_experts / n_routed_experts
MAX_TENSORS = 2_000_000  # tensors of one model (DeepSeek-V3 with MTP and fp8 scales: ~186,000)
MAX_MODEL_BYTES = 1 << 50  # 1 PiB
_LIMITS = {"num_hidden_layers": ("MAX_LAYERS", MAX_LAYERS), "num_nextn_predict_layers": ("MAX_LAYERS", MAX_LAYERS),
           "num_experts": ("MAX_EXPERTS", MAX_EXPERTS), "n_routed_experts": ("MAX_EXPERTS", MAX_EXPERTS),
           "n_shared_experts": ("MAX_EXPERTS", MAX_EXPERTS), "num_local_experts": ("MAX_EXPERTS", MAX_EXPERTS)}
# engineer "archs1": architectures whose head_dim defaults to hidden_size / num_attention_heads when the config has
# none (transformers LlamaAttention, Qwen2Attention, Qwen2MoeAttention, MixtralAttention: getattr(config, "head_dim",
# hidden_size // num_attention_heads))
HEAD_DIM_FROM_HIDDEN = frozenset({"llama", "qwen2", "qwen2_moe", "mixtral"})


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, (list, dict)) else f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


class _Config:
    """Typed access to a config mapping; errors name the file (``where``) and the key."""

    def __init__(self, config: Mapping[str, Any], where: str):
        if not isinstance(config, Mapping):
            raise ModelError(f"{where}: a config must be a JSON object, not {type(config).__name__}")
        self.c = config
        self.where = where

    def fail(self, key: str, problem: str) -> ModelError:
        return ModelError(f"{self.where}: key '{key}' {problem}")

    def get_int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.c.get(key, default)
        if value is _MISSING:
            raise self.fail(key, "is missing")
        if value is None and default is not _MISSING:
            value = default
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(key, f"must be an integer, got {_short(value)}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {_short(value)}")
        name, limit = _LIMITS.get(key, ("MAX_DIM", MAX_DIM))
        if value > limit:
            raise self.fail(key, f"must be <= {limit} ({name}, the limit for this key), got {_short(value)}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.c.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_short(value)}")
        return value

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self.c.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.fail(key, f"must be a list of integers, got {_short(value)}")
        return tuple(value)


def detect_arch(config: Mapping[str, Any], where: str = "config") -> Arch:
    """The :class:`Arch` of a config, from ``architectures[0]`` (else ``model_type``)."""
    archs = config.get("architectures") if isinstance(config, Mapping) else None
    supported = ", ".join(BY_CLASS)
    model_type = config.get("model_type") if isinstance(config, Mapping) else None
    if model_type is not None and not isinstance(model_type, str):  # even beside 'architectures': HF's
        # AutoConfig looks it up as a mapping key, so such a config loads nowhere else either
        raise ModelError(f"{where}: key 'model_type' must be a string such as 'llama', got {_short(model_type)}")
    if archs:
        if not isinstance(archs, list) or not isinstance(archs[0], str):
            raise ModelError(f"{where}: key 'architectures' must be a list of class names, got {_short(archs)}")
        key = BY_CLASS.get(archs[0])
        if key is None:
            raise ModelError(
                f"{where}: unsupported architecture {_short(archs[0])} (key 'architectures'); supported: {supported}"
            )
        return ARCHS[key]
    if model_type is None:
        raise ModelError(f"{where}: missing key 'architectures' (and no 'model_type'); supported: {supported}")
    key = BY_MODEL_TYPE.get(model_type)
    if key is None:
        raise ModelError(f"{where}: unsupported model_type {_short(model_type)} (key 'model_type'); supported: {supported}")
    return ARCHS[key]


def dims_from_config(config: Mapping[str, Any], *, where: str = "config", include_mtp: bool = False,
                     bf16_view: bool = False) -> ModelDims:
    """Fill :class:`ModelDims` from a HF config (MoE layer rules as in the transformers modelling code: Qwen3-MoE `decoder_sparse_step` / `mlp_only_layers`, DeepSeek-V3 `first_k_dense_replace` / `moe_layer_freq`)."""
    arch = detect_arch(config, where)
    c = _Config(config, where)
    hidden = c.get_int("hidden_size")
    layers = c.get_int("num_hidden_layers")
    heads = c.get_int("num_attention_heads")
    vocab = c.get_int("vocab_size")
    tie = c.get_bool("tie_word_embeddings", False)
    for flag in ("attention_bias", "mlp_bias"):
        if c.get_bool(flag, False) and not (flag == "attention_bias" and arch.key in _BIAS_ARCHS):
            raise c.fail(flag, "is true: bias tensors are not supported")
    kw: dict[str, Any] = {}
    if arch.key in _BIAS_ARCHS:  # archs2
        moe = _glm_gptoss_dims(c, arch.key, heads, layers, include_mtp, bf16_view, kw)
    elif arch.key == "deepseek_v3":
        nope, rope = c.get_int("qk_nope_head_dim"), c.get_int("qk_rope_head_dim")
        kw.update(
            num_kv_heads=heads,  # MLA: one latent, num_key_value_heads unused
            head_dim=nope + rope,
            q_lora_rank=c.get_int("q_lora_rank", 0, minimum=0),
            kv_lora_rank=c.get_int("kv_lora_rank"),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=c.get_int("v_head_dim"),
            num_experts=c.get_int("n_routed_experts", minimum=0),
            num_shared_experts=c.get_int("n_shared_experts", 0, minimum=0),
        )
        first_dense = c.get_int("first_k_dense_replace", minimum=0)
        freq = c.get_int("moe_layer_freq", 1)
        n_mtp = c.get_int("num_nextn_predict_layers", 0, minimum=0) if include_mtp else 0
        moe = tuple(l for l in range(layers + n_mtp) if l >= first_dense and l % freq == 0)
        kw["num_mtp_layers"] = n_mtp
    else:
        head_dim = c.c.get("head_dim")
        if head_dim is None and arch.key in HEAD_DIM_FROM_HIDDEN:
            if hidden % heads:
                raise c.fail("num_attention_heads", f"({heads}) does not divide hidden_size ({hidden}); set head_dim")
            head_dim = hidden // heads
        else:
            head_dim = c.get_int("head_dim")
        kw.update(head_dim=head_dim, num_kv_heads=c.get_int("num_key_value_heads", heads))
        moe = ()
        if arch.key == "qwen3_moe":
            kw["num_experts"] = c.get_int("num_experts", minimum=0)
            step = c.get_int("decoder_sparse_step", 1)
            dense_only = set(c.int_list("mlp_only_layers"))
            moe = tuple(l for l in range(layers) if l not in dense_only and (l + 1) % step == 0)
        elif arch.key in ("qwen2_moe", "mixtral"):
            moe = _archs1_moe(c, arch.key, layers, kw)
    if kw.get("num_experts"):
        if "moe_intermediate" not in kw:  # gpt-oss: intermediate_size, already read
            kw["moe_intermediate"] = c.get_int("moe_intermediate_size")
        kw["moe_layers"] = moe
    else:
        moe = ()
    all_layers = layers + kw.get("num_mtp_layers", 0)
    needs_dense = len(moe) < all_layers
    intermediate = c.get_int("intermediate_size") if needs_dense else c.get_int("intermediate_size", 0, minimum=0)
    if arch.key == "mixtral":  # its intermediate_size is the experts' width (moe_intermediate): no dense MLP
        intermediate = 0
    _check_consistency(c, arch.key, layers, heads, kw)
    return ModelDims(
        arch=arch.key, hidden=hidden, num_layers=layers, num_heads=heads, vocab=vocab,
        intermediate=intermediate, tie_embeddings=tie, **kw,
    )


def _archs1_moe(c: _Config, arch: str, layers: int, kw: dict[str, Any]) -> tuple[int, ...]:
    """Engineer "archs1": the MoE numbers of Qwen2-MoE and Mixtral; returns the MoE layers.

    Qwen2-MoE (transformers modeling_qwen2_moe.py Qwen2MoeDecoderLayer): MoE iff ``l not in mlp_only_layers`` and
    ``(l + 1) % decoder_sparse_step == 0``; one shared expert of ``shared_expert_intermediate_size`` (always built,
    with its ``shared_expert_gate``), held in ModelDims as ``num_shared_experts = shared_expert_intermediate_size /
    moe_intermediate_size`` (the layouts split the width ``moe_intermediate * num_shared_experts``), so the width
    must be a multiple of ``moe_intermediate_size`` (true of every published Qwen2-MoE / Qwen1.5-MoE config).
    Mixtral (modeling_mixtral.py MixtralDecoderLayer): every layer is MoE, ``num_local_experts`` experts of width
    ``intermediate_size`` (no dense MLP)."""
    if arch == "mixtral":
        kw["num_experts"] = c.get_int("num_local_experts")
        kw["moe_intermediate"] = c.get_int("intermediate_size")
        return tuple(range(layers))
    kw["num_experts"] = c.get_int("num_experts")
    im = c.get_int("moe_intermediate_size")
    shared = c.get_int("shared_expert_intermediate_size")
    if shared % im:
        raise c.fail("shared_expert_intermediate_size", f"({shared}) must be a multiple of 'moe_intermediate_size' "
                                                        f"({im}): {shared} % {im} = {shared % im}")
    kw["num_shared_experts"] = shared // im
    step = c.get_int("decoder_sparse_step", 1)
    dense_only = set(c.int_list("mlp_only_layers"))
    return tuple(l for l in range(layers) if l not in dense_only and (l + 1) % step == 0)


_BIAS_ARCHS = ("glm4_moe", "gpt_oss")  # archs2: architectures whose bias tensors are in the tables


def _glm_gptoss_dims(c: _Config, arch: str, heads: int, layers: int, include_mtp: bool, bf16_view: bool,
                     kw: dict[str, Any]) -> tuple[int, ...]:
    """archs2: GLM-4.5 MoE (transformers ``Glm4MoeConfig``) and gpt-oss (``GptOssConfig``) numbers into ``kw``;
    returns the MoE layers. GLM-4.5: ``attention_bias`` must be true (every published GLM-4.5 has q/k/v
    biases; the tables hold them), ``use_qk_norm``, ``first_k_dense_replace``, ``n_routed_experts``,
    ``n_shared_experts``, MTP layers as DeepSeek's. gpt-oss: every layer MoE, ``num_local_experts`` experts
    of width ``intermediate_size``; the published MXFP4 form is refused (``_refuse_mxfp4``)."""
    kw.update(head_dim=c.get_int("head_dim"), num_kv_heads=c.get_int("num_key_value_heads", heads))
    if arch == "glm4_moe":
        if not c.get_bool("attention_bias", False):
            raise c.fail("attention_bias", "is false: GLM-4.5 MoE is modelled with q/k/v biases "
                                           "(Glm4MoeAttention, attention_bias=true in every published config)")
        kw.update(num_experts=c.get_int("n_routed_experts", minimum=0),
                  num_shared_experts=c.get_int("n_shared_experts", 0, minimum=0),
                  qk_norm=c.get_bool("use_qk_norm", False))
        first_dense = c.get_int("first_k_dense_replace", 0, minimum=0)
        n_mtp = c.get_int("num_nextn_predict_layers", 0, minimum=0) if include_mtp else 0
        kw["num_mtp_layers"] = n_mtp
        return tuple(l for l in range(layers + n_mtp) if l >= first_dense)
    _refuse_mxfp4(c, bf16_view)
    if not c.get_bool("attention_bias", True):
        raise c.fail("attention_bias", "is false: gpt-oss is modelled with q/k/v/o biases (GptOssAttention)")
    kw.update(num_experts=c.get_int("num_local_experts"), moe_intermediate=c.get_int("intermediate_size"))
    return tuple(range(layers))


def _refuse_mxfp4(c: _Config, bf16_view: bool) -> None:
    """gpt-oss: the published checkpoints store the expert weights as MXFP4 (``*_blocks`` uint8 + ``*_scales``,
    ``quantization_config.quant_method = "mxfp4"``). Only the BF16 form is modelled: a MXFP4 config is refused
    except in the training view (``bf16_view``: no ``include_scales``), which describes the BF16 tensors a trainer
    holds, as the training view of a block-fp8 DeepSeek-V3 describes its bf16 tensors."""
    q = c.c.get("quantization_config")
    method = q.get("quant_method") if isinstance(q, Mapping) else None
    if method is None:
        return
    if method == "mxfp4" and bf16_view:
        return
    raise ModelError(
        f"{c.where}: key 'quantization_config.quant_method' is {_short(method)}: gpt-oss checkpoints quantized "
        f"this way store the expert weights as mlp.experts.gate_up_proj_blocks / _scales and down_proj_blocks / "
        f"_scales (uint8 MXFP4), which are not modelled. Modelled is the BF16 form (mlp.experts.gate_up_proj "
        f"[E, H, 2*I], down_proj [E, I, H] and their biases), the tensors a trainer holds and a BF16 checkpoint "
        f"stores (remove quantization_config from config.json for such a checkpoint). Why: MXFP4 packs two 4-bit "
        f"values per byte with one uint8 scale per 32 values, so the refit would move quantized blocks, and "
        f"neither the quantization nor vLLM's MXFP4 parameters (gpt_oss.py _load_weights_mxfp4) are modelled")


def _check_consistency(c: _Config, arch: str, layers: int, heads: int, kw: dict[str, Any]) -> None:
    """Cross-key arithmetic a checkpoint of this config must satisfy, every problem in one ModelError
    (naming the file, the keys and the arithmetic) instead of a failure deep in a layout or the planner.
    (Layer-range keys such as ``first_k_dense_replace`` / ``mlp_only_layers`` are not checked against
    ``num_hidden_layers``: a ``--layers N`` truncation legitimately keeps them.)"""
    problems: list[str] = []
    cfg = c.c

    def opt_int(key: str) -> int | None:
        v = cfg.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    if arch != "deepseek_v3":
        kv = kw["num_kv_heads"]
        if kv > heads or heads % kv:
            problems.append(f"'num_attention_heads' ({heads}) must be a multiple of 'num_key_value_heads' ({kv}) "
                            f"(grouped-query attention: {heads} % {kv} = {heads % kv})")
    experts = kw.get("num_experts", 0)
    if experts:
        e_key = {"deepseek_v3": "n_routed_experts", "glm4_moe": "n_routed_experts", "mixtral": "num_local_experts",
                 "gpt_oss": "num_local_experts"}.get(arch, "num_experts")
        topk = opt_int("num_experts_per_tok")
        if topk is not None and not 1 <= topk <= experts:
            problems.append(f"'num_experts_per_tok' ({topk}) must be between 1 and '{e_key}' ({experts})")
        if arch in ("deepseek_v3", "glm4_moe"):
            n_group, topk_group = opt_int("n_group"), opt_int("topk_group")
            if n_group is not None and (n_group < 1 or experts % n_group):
                problems.append(f"'n_routed_experts' ({experts}) must be a multiple of 'n_group' ({n_group})"
                                + (f" ({experts} % {n_group} = {experts % n_group})" if n_group >= 1 else ""))
            if n_group is not None and topk_group is not None and not 1 <= topk_group <= n_group:
                problems.append(f"'topk_group' ({topk_group}) must be between 1 and 'n_group' ({n_group})")
    if problems:
        if len(problems) == 1:
            raise ModelError(f"{c.where}: {problems[0]}")
        raise ModelError(f"{c.where}: {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))


def model_dtype(config: Mapping[str, Any], where: str = "config") -> str:
    """``torch_dtype`` (or transformers 5 ``dtype``) of the config; bfloat16 when absent."""
    key = "torch_dtype" if config.get("torch_dtype") is not None else "dtype"
    value = config.get(key) or "bfloat16"
    if isinstance(value, str) and value.startswith("torch."):
        value = value[len("torch."):]
    if not isinstance(value, str) or value not in _FLOAT_DTYPES:
        raise ModelError(f"{where}: key '{key}' must be one of {', '.join(_FLOAT_DTYPES)}, got {_short(value)}")
    return value


def fp8_format(config: Mapping[str, Any], where: str = "config") -> tuple[str, tuple[int, int]] | None:
    """(fp8 dtype, weight block) of a block-fp8 ``quantization_config``; None when not fp8."""
    q = config.get("quantization_config")
    if not isinstance(q, Mapping) or q.get("quant_method") != "fp8":
        return None
    fmt = q.get("fmt", "e4m3")
    dtype = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}.get(fmt) if isinstance(fmt, str) else None
    if dtype is None:
        raise ModelError(f"{where}: key 'quantization_config.fmt' must be e4m3 or e5m2, got {_short(fmt)}")
    block = q.get("weight_block_size")
    if (
        not isinstance(block, list) or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= MAX_DIM for b in block)
    ):
        raise ModelError(
            f"{where}: key 'quantization_config.weight_block_size' must be [rows, cols] "
            f"(only block-wise fp8 is supported; each between 1 and {MAX_DIM}), got {_short(block)}"
        )
    return dtype, (block[0], block[1])


class _Builder:
    """Expands the block tables into TensorSpecs (fp8 weights + scales when asked)."""

    def __init__(self, dims: ModelDims, dtype: str, fp8: tuple[str, tuple[int, int]] | None):
        self.sym = symbols(dims)
        self.dtype = dtype
        self.fp8 = fp8
        self.out: list[TensorSpec] = []
        self._resolved: dict[int, tuple] = {}

    def _resolve(self, block: Block) -> tuple:
        """Per row of a block: (suffix, kind, role, shape, dtype, scale shape or None); once per block."""
        got = self._resolved.get(id(block))
        if got is None:
            rows = []
            for suffix, kind, shape_syms, dtype in block:
                shape = tuple(self.sym[s] for s in shape_syms)
                dtype = dtype or self.dtype
                scale = None
                if self.fp8 is not None and kind in FP8_KINDS:
                    dtype = self.fp8[0]
                    (bo, bi), (o, i) = self.fp8[1], shape
                    scale = (ceil(o / bo), ceil(i / bi))
                rows.append((suffix, kind, KIND_ROLE[kind], shape, dtype, scale, prod(shape),
                             None if scale is None else prod(scale)))
            got = self._resolved[id(block)] = (block, tuple(rows))
        return got[1]

    def _add(self, name: str, kind: str, role: str, shape: tuple, dtype: str, scale, layer, expert, numel: int,
             scale_numel) -> None:
        self.out.append(tensor_spec(name, shape, dtype, role, kind, layer, expert, None, numel))
        if scale is not None:
            self.out.append(tensor_spec(name[: -len("weight")] + "weight_scale_inv", scale, "float32", "scale",
                                        "scale_inv", layer, expert, name, scale_numel))

    def row(self, prefix: str, row, layer: int | None = None) -> None:
        for suffix, kind, role, shape, dtype, scale, numel, scale_numel in self._resolve((row,)):
            self._add(prefix + suffix, kind, role, shape, dtype, scale, layer, None, numel, scale_numel)

    def blocks(self, prefix: str, blocks: tuple[Block, ...], layer: int) -> None:
        for block in blocks:
            rows = self._resolve(block)
            if is_expert_block(block):
                for e in range(self.sym["E"]):
                    for suffix, kind, role, shape, dtype, scale, numel, scale_numel in rows:
                        self._add(prefix + suffix.format(e=e), kind, role, shape, dtype, scale, layer, e, numel,
                                  scale_numel)
            else:
                for suffix, kind, role, shape, dtype, scale, numel, scale_numel in rows:
                    self._add(prefix + suffix, kind, role, shape, dtype, scale, layer, None, numel, scale_numel)


def spec_from_config(
    config: Mapping[str, Any],
    name: str,
    *,
    source: str = "",
    include_mtp: bool = False,
    include_scales: bool = False,
) -> ModelSpec:
    """The tensor inventory a HF checkpoint of this config holds.

    ``include_mtp``: add DeepSeek / GLM-4.5 MTP layers (``num_nextn_predict_layers``), as layers L, L+1, ...
    ``include_scales``: for a block-fp8 ``quantization_config``, describe the fp8 linear weights as
    ``float8_*`` plus their fp32 ``weight_scale_inv`` (the checkpoint view). Default: every weight in
    the model dtype (the training view). No effect on configs without fp8 quantization.
    """
    where = source or f"config of {name}"
    arch = detect_arch(config, where)
    dims = dims_from_config(config, where=where, include_mtp=include_mtp and arch.mtp, bf16_view=not include_scales)
    fp8 = fp8_format(config, where) if include_scales else None
    _check_tensor_count(arch, dims, fp8 is not None, where)
    b = _Builder(dims, model_dtype(config, where), fp8)
    b.row("", EMBED)
    for layer in range(dims.num_layers):
        b.blocks(f"model.layers.{layer}.", arch.layer_blocks(dims, layer), layer)
    b.row("", FINAL_NORM)
    if not dims.tie_embeddings:
        b.row("", LM_HEAD)
    for layer in range(dims.num_layers, dims.num_layers + dims.num_mtp_layers):
        prefix = f"model.layers.{layer}."
        b.blocks(prefix, (MTP_BEFORE, *arch.layer_blocks(dims, layer), MTP_AFTER), layer)
    total = sum(t.nbytes for t in b.out)
    if total > MAX_MODEL_BYTES:
        raise ModelError(f"{where}: the model holds {total:,} bytes, more than the limit of {MAX_MODEL_BYTES:,} "
                         "(MAX_MODEL_BYTES, 1 PiB); check hidden_size, vocab_size and the intermediate sizes")
    return ModelSpec(name=name, dims=dims, tensors=tuple(b.out), source=source, config=dict(config))


def _check_tensor_count(arch: Arch, dims: ModelDims, scales: bool, where: str) -> None:
    """Count the tensors the tables would expand to (one loop over layers, no tensor built) and refuse
    more than ``MAX_TENSORS`` with the arithmetic."""
    per_layer: dict[tuple[int, ...], int] = {}
    total = 3
    experts = 0
    for layer in range(dims.num_layers + dims.num_mtp_layers):
        blocks = arch.layer_blocks(dims, layer)
        if layer >= dims.num_layers:
            blocks = (MTP_BEFORE, *blocks, MTP_AFTER)
        key = tuple(id(b) for b in blocks)
        if key not in per_layer:
            per_layer[key] = sum(len(b) * (dims.num_experts if is_expert_block(b) else 1) for b in blocks)
        total += per_layer[key]
        experts += sum(len(b) * dims.num_experts for b in blocks if is_expert_block(b))
    total *= 2 if scales else 1  # at most one weight_scale_inv per tensor
    if total > MAX_TENSORS:
        raise ModelError(
            f"{where}: {dims.num_layers + dims.num_mtp_layers} layers (num_hidden_layers"
            f"{' + MTP' if dims.num_mtp_layers else ''}) with {dims.num_experts} experts expand to {total:,} tensors "
            f"({experts:,} expert tensors), more than the limit of {MAX_TENSORS:,} (MAX_TENSORS)")
