"""The exchange space: an ordered list of HF checkpoint tensors.

Every layout (trainer or inference) is expressed against these names and shapes, never against a
framework's own parameter names. Fused framework parameters are several HF tensors side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # the annotation only; numpy is imported where it is used
    import numpy as np

# torch dtype names -> bytes per element. Safetensors names are mapped to these on read.
DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {
        "float64": 8,
        "float32": 4,
        "bfloat16": 2,
        "float16": 2,
        "float8_e4m3fn": 1,
        "float8_e5m2": 1,
        "int64": 8,
        "int32": 4,
        "int16": 2,
        "int8": 1,
        "uint8": 1,
        "bool": 1,
    }
)

# Coarse roles (used by the hybrid transport and per-role totals).
ROLES = ("embedding", "attention", "norm", "ffn", "expert", "router", "head", "scale")

# Fine kinds: what a layout rule keys on. Per layer unless noted.
KINDS = (
    "embed",  # model.embed_tokens.weight (global) / MTP embed_tokens
    "lm_head",  # lm_head.weight (global) / MTP shared_head.head
    "final_norm",  # model.norm.weight
    "input_norm", "post_attn_norm",
    "q", "k", "v", "o",  # standard attention projections
    "q_norm", "k_norm",  # Qwen3 per-head norms [head_dim]
    "q_a", "q_a_norm", "q_b", "kv_a", "kv_a_norm", "kv_b",  # MLA (DeepSeek)
    "mlp_gate", "mlp_up", "mlp_down",  # dense MLP
    "shared_gate", "shared_up", "shared_down",  # shared experts (DeepSeek)
    "router", "router_bias",  # mlp.gate.weight, mlp.gate.e_score_correction_bias
    "expert_gate", "expert_up", "expert_down",  # routed experts (TensorSpec.expert set)
    "mtp_enorm", "mtp_hnorm", "mtp_eh_proj", "mtp_head_norm",  # DeepSeek MTP extras
    "scale_inv",  # fp8 block scale of another tensor (TensorSpec.scale_of set)
    "q_bias", "k_bias", "v_bias",  # Qwen2 / Qwen2-MoE / GLM-4.5 / gpt-oss q/k/v_proj.bias [Q] / [KV]
    "shared_expert_gate",  # Qwen2-MoE mlp.shared_expert_gate.weight [1, H]
    # archs2: gpt-oss o_proj bias, sinks [num_heads], router bias (nn.Linear bias),
    # gpt-oss stacked experts (all experts in one tensor: TensorSpec.expert None)
    "o_bias", "sinks", "router_linear_bias",
    "stacked_gate_up", "stacked_gate_up_bias", "stacked_down", "stacked_down_bias",
)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One HF checkpoint tensor."""

    name: str  # exact HF checkpoint name, e.g. "model.layers.7.self_attn.q_proj.weight"
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, a key of DTYPE_BYTES
    role: str  # one of ROLES
    kind: str  # one of KINDS
    layer: int | None = None  # global decoder layer index (MTP layers continue after the last one)
    expert: int | None = None  # global routed-expert index
    scale_of: str | None = None  # for kind == "scale_inv": the weight it scales
    # derived once from shape and dtype (hot: the planner reads them per tensor many times)
    numel: int = field(init=False, repr=False, compare=False)
    nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        numel = prod(self.shape)
        object.__setattr__(self, "numel", numel)
        object.__setattr__(self, "nbytes", numel * DTYPE_BYTES[self.dtype])

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]


_TENSOR_FIELDS = ("name", "shape", "dtype", "role", "kind", "layer", "expert", "scale_of", "numel", "nbytes")
_SET = tuple(TensorSpec.__dict__[f].__set__ for f in _TENSOR_FIELDS)  # the slots' own setters


def tensor_spec(name: str, shape: tuple[int, ...], dtype: str, role: str, kind: str, layer: int | None,
                expert: int | None, scale_of: str | None, numel: int) -> TensorSpec:
    """``TensorSpec(name, shape, dtype, role, kind, layer, expert, scale_of)`` for a caller that knows the
    shape's ``numel`` (``prod(shape)``, once per row of a block table): the same object (equal, same hash),
    made through the slots' setters, not the frozen dataclass's ``__init__`` (DeepSeek-V3's 45,395 tensors:
    0.06 s of a model's 0.11 s). The model builder's path; anything else calls ``TensorSpec``."""
    t = object.__new__(TensorSpec)
    s = _SET
    s[0](t, name)
    s[1](t, shape)
    s[2](t, dtype)
    s[3](t, role)
    s[4](t, kind)
    s[5](t, layer)
    s[6](t, expert)
    s[7](t, scale_of)
    s[8](t, numel)
    s[9](t, numel * DTYPE_BYTES[dtype])
    return t


@dataclass(frozen=True, slots=True)
class ModelDims:
    """The architecture numbers layout rules need (HF config names in comments)."""

    arch: str  # a key of models/architectures.py ARCHS ("llama", "qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss", ...)
    hidden: int  # hidden_size
    num_layers: int  # num_hidden_layers (main model, without MTP)
    num_heads: int  # num_attention_heads
    num_kv_heads: int  # num_key_value_heads (== num_heads for MLA)
    head_dim: int  # head_dim (explicit for Qwen3; hidden/heads otherwise; qk_nope+qk_rope for MLA q)
    vocab: int  # vocab_size
    intermediate: int  # intermediate_size (dense MLP)
    tie_embeddings: bool = False
    num_experts: int = 0  # num_experts / n_routed_experts
    moe_intermediate: int = 0
    num_shared_experts: int = 0
    moe_layers: tuple[int, ...] = ()  # global indices of MoE layers
    num_mtp_layers: int = 0  # DeepSeek num_nextn_predict_layers included in the spec
    # MLA (DeepSeek); 0 when absent
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_norm: bool = False  # archs2: GLM-4.5 use_qk_norm (per-head q/k RMSNorm)


@dataclass(frozen=True)
class ModelSpec:
    """An ordered, immutable tensor inventory plus the architecture numbers."""

    name: str
    dims: ModelDims
    tensors: tuple[TensorSpec, ...]
    source: str = ""  # where it came from: preset name, config.json path or index path
    config: Mapping[str, Any] = field(default_factory=dict)  # the HF config (read-only view)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        names = [t.name for t in self.tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"model {self.name}: duplicate tensor names")

    @cached_property
    def num_params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @cached_property
    def num_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @cached_property
    def itemsizes(self) -> "np.ndarray":
        """Bytes per element of every tensor, as an int64 array."""
        import numpy as np

        return np.fromiter((t.itemsize for t in self.tensors), dtype=np.int64, count=len(self.tensors))

    @cached_property
    def nbytes_array(self) -> "np.ndarray":
        """Bytes of every tensor, as an int64 array."""
        import numpy as np

        return np.fromiter((t.nbytes for t in self.tensors), dtype=np.int64, count=len(self.tensors))

    @cached_property
    def kind_array(self) -> "np.ndarray":
        """The ``kind`` of every tensor, as a numpy string array (for masks: ``kind_array == "expert_up"``)."""
        import numpy as np

        return np.asarray([t.kind for t in self.tensors], dtype=str)

    @cached_property
    def layer_array(self) -> "np.ndarray":
        """The ``layer`` of every tensor, -1 where it has none, as an int64 array."""
        import numpy as np

        return np.fromiter((-1 if t.layer is None else t.layer for t in self.tensors), dtype=np.int64,
                           count=len(self.tensors))

    @cached_property
    def expert_array(self) -> "np.ndarray":
        """The routed ``expert`` of every tensor, -1 where it has none, as an int64 array."""
        import numpy as np

        return np.fromiter((-1 if t.expert is None else t.expert for t in self.tensors), dtype=np.int64,
                           count=len(self.tensors))

    @cached_property
    def shape_codes(self) -> "np.ndarray":
        """Per tensor, the number of its shape among the distinct shapes (in first-seen order), int64."""
        import numpy as np

        number: dict[tuple[int, ...], int] = {}
        return np.fromiter((number.setdefault(t.shape, len(number)) for t in self.tensors), dtype=np.int64,
                           count=len(self.tensors))

    @cached_property
    def kind_codes(self) -> "np.ndarray":
        """Per tensor, the position of its ``kind`` in ``KINDS``, int64."""
        import numpy as np

        number = {k: c for c, k in enumerate(KINDS)}
        return np.fromiter((number[t.kind] for t in self.tensors), dtype=np.int64, count=len(self.tensors))

    @cached_property
    def inventory_text(self) -> str:
        """``name|shape|dtype`` of every tensor, one a line (what plan fingerprints hash)."""
        shapes: dict[tuple[int, ...], str] = {}  # a few distinct shapes: each formatted once
        return "\n".join(f"{t.name}|{shapes.get(t.shape) or shapes.setdefault(t.shape, str(t.shape))}|{t.dtype}"
                         for t in self.tensors)

    def __reduce__(self):
        """Pickle with a plain dict for ``config`` (a mappingproxy does not pickle); caches dropped."""
        return (ModelSpec, (self.name, self.dims, self.tensors, self.source, dict(self.config)))

    def index(self, name: str) -> int:
        """Position of a tensor by HF name (O(1) after first call)."""
        idx = self.__dict__.get("_name_index")
        if idx is None:
            idx = {t.name: i for i, t in enumerate(self.tensors)}
            object.__setattr__(self, "_name_index", idx)
        return idx[name]

    def tensor(self, name: str) -> TensorSpec:
        return self.tensors[self.index(name)]
