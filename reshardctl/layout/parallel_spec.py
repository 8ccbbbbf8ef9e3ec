"""Parallelism strings (``--train "tp=4,pp=2,ep=2"``, ``--infer "tp=8,dp=2"``) -> ``ParallelSpec``.

Keys (all positive integers unless noted; every key optional):

==================== =========================================================================
``tp``               tensor parallel size (default 1)
``pp``               pipeline parallel size (default 1)
``ep``               expert parallel size (default 1). vLLM: ``ep=N`` switches expert parallel on;
                     ``ep = tp`` (separate engines) or a multiple of ``tp`` dividing ``dp*tp`` (vLLM's
                     EP group is the flattened DP x TP ranks of an in-engine-DP engine).
``etp``              Megatron expert tensor parallel size (default: ``tp``)
``dp``               data parallel size. May be omitted: it is then derived from the world size
                     (``world / (tp*cp*pp)``) when the layout is given one, else 1.
``cp``               Megatron context parallel size (default 1)
``vpp``              Megatron virtual pipeline chunks per pipeline rank (default 1)
``first_stage_layers`` / ``last_stage_layers``
                     Megatron uneven pipeline split (``num_layers_in_first/last_pipeline_stage``)
``expert_parallel``  vLLM ``enable_expert_parallel`` (true/false/1/0/on/off/yes/no); default:
                     on when ``ep > 1``
``vocab_divisor``    Megatron vocabulary padding: pad V to a multiple of ``divisor*tp`` (Megatron-LM's
                     ``--make-vocab-size-divisible-by``, legacy default 128), or ``none`` (the
                     default: Megatron-Bridge's ``should_pad_vocab=False``)
``pp_layout``        Megatron ``pipeline_model_parallel_layout`` (``E``/``t``/``m``/``L``, ``|``,
                     ``(..)*n``; write it without commas, which separate keys here)
``embedding_in_split`` / ``loss_in_split``
                     Megatron ``account_for_embedding/loss_in_pipeline_split`` (booleans)
``pp_partition``     vLLM ``VLLM_PP_LAYER_PARTITION`` / SGLang ``SGLANG_PP_LAYER_PARTITION``, layers
                     per stage separated by ``:`` or ``/`` (e.g. ``pp_partition=30:31``)
``dp_mode``          vLLM: ``in_engine`` (vLLM data parallel inside an engine; EP over the
                     engine's dp x tp; ``ep = k*tp`` makes ``dp/k`` such engines of in-engine DP k)
                     or ``engines`` (each dp replica its own engine; EP, if on, = tp inside each).
                     Default: ``in_engine`` iff ``ep > tp`` (NeMo RL's rule, ``vllm_dp_size = ep //
                     tp``), else ``engines`` (one engine per replica, as NeMo RL, verl and slime run)
``vllm``             vLLM version whose rules apply (a string such as ``0.33``; default ``0.33``;
                     the known versions: ``reshardctl/layout/vllm_versions.py``)
``placement``        vLLM ``expert_placement_strategy``: ``linear`` (default) or ``round_robin``
``all2all``          vLLM ``all2all_backend`` (default ``allgather_reducescatter``)
``redundant``        vLLM EPLB ``num_redundant_experts`` (turns EPLB on; E + R physical slots)
``expert_map``       vLLM EPLB: a JSON file with the physical->logical expert map (one list, or
                     one list per MoE layer)
``dp_attention``     SGLang ``--enable-dp-attention`` (boolean)
``mla_down_proj``    Megatron MLA ``linear_q_down_proj`` / ``linear_kv_down_proj``: ``replicated``
                     (default; the Transformer Engine spec's duplicated TELinear) or ``column``
                     (megatron-core's local spec: ColumnParallelLinear split over tp)
``rank_order``       Megatron ``initialize_model_parallel(order=...)``: ``tp-cp-ep-dp-pp`` (default,
                     megatron-core's) or ``tp-cp-ep-pp-dp`` (Megatron-Bridge / Megatron-LM
                     ``use_tp_pp_dp_mapping=True``); alias ``use_tp_pp_dp_mapping=true|false``
==================== =========================================================================

Aliases: ``first``/``last`` for the stage-layer keys, ``ep_enabled`` for ``expert_parallel``,
the framework names ``account_for_embedding_in_pipeline_split``, ``account_for_loss_in_pipeline_split``,
``pipeline_model_parallel_layout``, ``expert_placement_strategy``, ``num_redundant_experts``,
``make_vocab_size_divisible_by``; ``use_tp_pp_dp_mapping`` takes a boolean and sets ``rank_order``.
Separators: ``,`` or whitespace. Errors are collected and raised together as one ``LayoutError``
naming the flag, the key and a did-you-mean.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, fields

from reshardctl.errors import LayoutError

_INT_KEYS = ("tp", "pp", "ep", "etp", "dp", "cp", "vpp", "first_stage_layers", "last_stage_layers", "redundant")
_BOOL_KEYS = ("expert_parallel", "embedding_in_split", "loss_in_split", "dp_attention")
_CHOICE_KEYS = {"dp_mode": ("in_engine", "engines"), "placement": ("linear", "round_robin"),
                "mla_down_proj": ("replicated", "column"), "rank_order": ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")}
_STR_KEYS = ("pp_layout", "all2all", "expert_map", "vllm")
_OTHER_KEYS = ("vocab_divisor", "pp_partition")
_ALIASES = {"first": "first_stage_layers", "last": "last_stage_layers", "ep_enabled": "expert_parallel",
            "account_for_embedding_in_pipeline_split": "embedding_in_split",
            "account_for_loss_in_pipeline_split": "loss_in_split",
            "pipeline_model_parallel_layout": "pp_layout", "expert_placement_strategy": "placement",
            "num_redundant_experts": "redundant", "make_vocab_size_divisible_by": "vocab_divisor",
            "all2all_backend": "all2all", "enable_dp_attention": "dp_attention",
            "use_tp_pp_dp_mapping": "rank_order"}
# Megatron-Bridge DistributedInitConfig.use_tp_pp_dp_mapping (a boolean) -> rank_order
_RANK_ORDER_OF_MAPPING = {True: "tp-cp-ep-pp-dp", False: "tp-cp-ep-dp-pp"}
_ALL_KEYS = _INT_KEYS + _BOOL_KEYS + tuple(_CHOICE_KEYS) + _STR_KEYS + _OTHER_KEYS
_INT_RE = re.compile(r"[0-9]+")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class ParallelSpec:
    """One side's parallel sizes. ``dp=None`` means "derive from the world size"; ``etp=None`` = ``tp``."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int | None = None
    dp: int | None = None
    cp: int = 1
    vpp: int = 1
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    expert_parallel: bool | None = None
    vocab_divisor: int | None = None  # None: no padding (Megatron-Bridge default)
    pp_layout: str | None = None
    embedding_in_split: bool | None = None
    loss_in_split: bool | None = None
    pp_partition: tuple[int, ...] | None = None
    dp_mode: str | None = None
    placement: str | None = None
    all2all: str | None = None
    redundant: int | None = None
    expert_map: str | None = None
    dp_attention: bool | None = None
    mla_down_proj: str | None = None  # None: "replicated" (the TE spec)
    rank_order: str | None = None  # None: "tp-cp-ep-dp-pp" (megatron-core's default order)
    vllm: str | None = None  # the vLLM version whose rules apply (None: vllm_versions.DEFAULT_VLLM)

    def given(self) -> list[str]:
        """Names of the keys set away from their defaults (for "not a vLLM option" checks)."""
        return [f.name for f in fields(self) if getattr(self, f.name) != f.default]

    def __str__(self) -> str:
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            default = f.default
            if v is None or (v == default and f.name not in ("tp", "pp")):
                continue
            if isinstance(v, tuple):
                v = ":".join(map(str, v))
            parts.append(f"{f.name}={str(v).lower() if isinstance(v, bool) else v}")
        return ",".join(parts)


MAX_SIZE = 1 << 20  # any one parallel size (a world of a million ranks is far beyond any site)
MAX_TEXT = 1000  # characters of a parallel string


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def parse_parallel(text: str | None, *, flag: str = "--train") -> ParallelSpec:
    """Parse ``"tp=4,pp=2,ep=2"``. None gives the all-defaults spec; an empty (or blank) string is a
    ``LayoutError`` (leave the flag out for the default layout instead)."""
    if text is None:
        return ParallelSpec()
    if not text.strip():
        raise LayoutError(f"{flag} {text!r}: empty; leave {flag} out for the default, or give sizes such as tp=4,pp=2")
    if len(text) > MAX_TEXT:
        raise LayoutError(f"{flag} {_short(text)}: {len(text):,} characters, more than the limit of {MAX_TEXT}")
    problems: list[str] = []
    values: dict[str, object] = {}
    known = list(_ALL_KEYS) + list(_ALIASES)
    for item in text.replace(",", " ").split():
        if "=" not in item:
            problems.append(f"{flag} {text!r}: {item!r} is not key=value (e.g. tp=4)")
            continue
        key, _, raw = item.partition("=")
        key = key.strip().lower().replace("-", "_")
        raw = raw.strip()
        canon = _ALIASES.get(key, key)
        if canon not in _ALL_KEYS:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(
                f"{flag}: unknown key {key!r}{hint} (known: {', '.join(_ALL_KEYS)})"
            )
            continue
        if canon in values:
            problems.append(f"{flag}: key {key!r} given twice")
            continue
        if key == "use_tp_pp_dp_mapping":
            low = raw.lower()
            if low in _TRUE | _FALSE:
                values[canon] = _RANK_ORDER_OF_MAPPING[low in _TRUE]
            else:
                problems.append(f"{flag}: {key}={raw!r} is not a boolean (true/false/1/0/on/off)")
            continue
        if canon in _CHOICE_KEYS:
            if raw.lower() not in _CHOICE_KEYS[canon]:
                problems.append(f"{flag}: {key}={raw!r}: expected one of {', '.join(_CHOICE_KEYS[canon])}")
            else:
                values[canon] = raw.lower()
            continue
        if canon in _STR_KEYS:
            if not raw:
                problems.append(f"{flag}: {key}= needs a value")
            else:
                values[canon] = raw
            continue
        if canon == "vocab_divisor":
            if raw.lower() in ("none", "0", "off", "false"):
                values[canon] = None
                continue
        if canon == "pp_partition":
            items = [x for x in raw.replace("/", ":").split(":")]
            try:
                nums = tuple(int(x) for x in items)
            except ValueError:
                problems.append(f"{flag}: pp_partition={raw!r}: expected layer counts separated by ':' "
                                f"(e.g. 30:31)")
                continue
            if any(n <= 0 for n in nums):
                problems.append(f"{flag}: pp_partition={raw!r}: every stage needs at least one layer")
                continue
            values[canon] = nums
            continue
        if canon in _BOOL_KEYS:
            low = raw.lower()
            if low in _TRUE:
                values[canon] = True
            elif low in _FALSE:
                values[canon] = False
            else:
                problems.append(f"{flag}: {key}={raw!r} is not a boolean (true/false/1/0/on/off)")
            continue
        if not _INT_RE.fullmatch(raw):  # ASCII digits only: no '+5', '5_0', '٣' (int() takes all three)
            problems.append(f"{flag}: {key}={_short(raw)} is not an integer" if not _INT_RE.fullmatch(raw[1:])
                            or not raw.startswith("-") else f"{flag}: {key}={raw[:40]} must be a positive integer")
            continue
        if len(raw.lstrip("0")) > 7:  # before int(): a 5,000-digit value is refused by its length
            problems.append(f"{flag}: {key}={_short(raw)} is more than the limit of {MAX_SIZE}")
            continue
        n = int(raw)
        if n <= 0:
            problems.append(f"{flag}: {key}={n} must be a positive integer")
            continue
        if n > MAX_SIZE:
            problems.append(f"{flag}: {key}={n} is more than the limit of {MAX_SIZE}")
            continue
        values[canon] = n
    if values.get("vpp", 1) > 1 and values.get("pp", 1) == 1:
        problems.append(f"{flag}: vpp={values['vpp']} needs pp > 1 (virtual pipeline chunks interleave pipeline "
                        "stages; with pp=1 there is no pipeline): give pp=2 or more, or drop vpp")
    if problems:
        raise LayoutError(problems, hint=f"{flag} takes e.g. \"tp=4,pp=2,ep=2\"")
    return ParallelSpec(**values)  # type: ignore[arg-type]
