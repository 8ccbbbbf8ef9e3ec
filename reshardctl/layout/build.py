"""One factory for a side's layout: a parallel string + a style (or a layout file) -> ``SideLayout``.

Styles: train ``megatron`` (default) | ``dtensor``; infer ``vllm`` (default) | ``sglang`` | ``dtensor``.
``dtensor`` maps the parallel string onto a 2-D DTensor mesh ``(dp, tp)`` (``rank = dp*TP + tp``):
column-parallel HF tensors (q/k/v, gate/up, q_b/kv_b, embeddings, lm_head, MTP eh_proj, expert gate/up)
``(Replicate(), Shard(0))``, row-parallel ones (o, down) ``(Replicate(), Shard(1))``, everything else
replicated — torchtitan-style TP on unfused HF tensors with plain DDP replicas; pp/ep/cp/vpp need a
layout file. A layout file (``--train-layout``/``--infer-layout``) overrides the string and the style.

Defaults when no parallel string is given fit the ``local`` site profile (4 ranks a side):
``tp=2,dp=2`` on both sides (``dp`` is derived from ``world_size`` when one is given).
"""

from __future__ import annotations

from reshardctl.errors import LayoutError
from reshardctl.layout.parallel_spec import ParallelSpec, parse_parallel
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec

STYLES = {"train": ("megatron", "dtensor"), "infer": ("vllm", "sglang", "dtensor")}
DEFAULT_STYLE = {"train": "megatron", "infer": "vllm"}
DEFAULT_SPEC = {"train": "tp=2,dp=2", "infer": "tp=2,dp=2"}

_COLUMN = frozenset({"q", "k", "v", "q_b", "kv_b", "mlp_gate", "mlp_up", "shared_gate", "shared_up", "embed",
                     "lm_head", "mtp_eh_proj", "expert_gate", "expert_up",
                     # a ColwiseParallel linear shards its bias like its weight's rows (torch
                     # distributed/tensor/parallel/style.py ColwiseParallel._partition_linear_fn: weight and bias Shard(0))
                     "q_bias", "k_bias", "v_bias"})
_ROW = frozenset({"o", "mlp_down", "shared_down", "expert_down"})


def build_layout(model: ModelSpec, side: str, spec: str | None = None, style: str | None = None,
                 layout_file: str | None = None, *, world_size: int | None = None) -> SideLayout:
    """``side`` is ``train`` or ``infer``; ``spec`` e.g. ``"tp=4,pp=2"`` (None: ``DEFAULT_SPEC``)."""
    if side not in STYLES:
        raise LayoutError(f"side must be 'train' or 'infer', got {side!r}")
    flag = f"--{side}"
    if layout_file:
        from reshardctl.layout.layout_file import load_layout_file

        return load_layout_file(layout_file, model, side)  # type: ignore[arg-type]
    style = style or DEFAULT_STYLE[side]
    if style not in STYLES[side]:
        raise LayoutError(f"--{side}-style {style!r}: expected one of {', '.join(STYLES[side])}")
    if spec is None and world_size is None:
        spec = DEFAULT_SPEC[side]
    elif spec is None:
        spec = "tp=2" if world_size % 2 == 0 else "tp=1"
    ps = parse_parallel(spec, flag=flag)
    try:
        if style == "megatron":
            from reshardctl.layout.megatron import MegatronLayout

            return MegatronLayout(model, ps, world_size)
        if style == "vllm":
            from reshardctl.layout.vllm import VllmLayout

            return VllmLayout(model, ps, world_size)
        if style == "sglang":
            from reshardctl.layout.sglang import SglangLayout

            return SglangLayout(model, ps, world_size)
        return dtensor_from_parallel(model, side, ps, world_size)
    except LayoutError as e:  # the layout cannot be built, but its rank count is known: keep it for the
        if getattr(e, "world_size", None) is None:  # allocation check (every violation at once)
            e.world_size = world_size if world_size is not None else spec_world_size(model, style, ps)
        raise


def spec_world_size(model: ModelSpec, style: str, ps: ParallelSpec) -> int:
    """Ranks a parallel string asks for, without building (or validating) the layout: the same
    arithmetic as ``MegatronLayout`` / ``VllmLayout`` / the dtensor mesh when no world size is given."""
    if style == "megatron":
        from math import lcm

        tc, etp = ps.tp * ps.cp, ps.etp or ps.tp
        dp = ps.dp if ps.dp is not None else (
            lcm(tc, etp * ps.ep) // tc if (model.dims.num_experts and ps.ep > 1) else 1)
        return tc * dp * ps.pp
    if style == "vllm":
        dp = ps.dp if ps.dp is not None else (
            ps.ep // ps.tp if ps.ep > 1 and ps.ep % ps.tp == 0 and ps.dp_mode != "engines" else 1)
        return dp * ps.pp * ps.tp
    if style == "sglang":
        return (1 if ps.dp_attention else (ps.dp or 1)) * ps.pp * ps.tp
    return (ps.dp or 1) * ps.tp


def dtensor_from_parallel(model: ModelSpec, side: str, ps: ParallelSpec, world_size: int | None = None) -> SideLayout:
    try:
        from reshardctl.layout.dtensor import DTensorLayout, Mesh, Replicate, Shard, to_template
    except ImportError as e:  # pragma: no cover - the module is part of the package
        raise LayoutError(f"dtensor style needs reshardctl.layout.dtensor ({e})") from None
    problems = [f"--{side}-style dtensor: {key} is a Megatron/vLLM/SGLang option" for key in ps.given()
                if key not in ("tp", "dp", "pp", "ep", "cp", "vpp")]
    for key in ("pp", "ep", "cp", "vpp"):
        if getattr(ps, key) != 1:
            problems.append(f"--{side}-style dtensor maps tp and dp onto a (dp, tp) mesh; {key}={getattr(ps, key)} "
                            f"needs a layout file (--{side}-layout FILE)")
    tp = ps.tp
    if tp > 1 and model.dims.arch == "gpt_oss":  # archs2
        problems.append(f"--{side}-style dtensor tp={tp}: the column/row rule by kind does not know gpt-oss's stacked "
                        f"experts and attention sinks (transformers' own tp plan shards them its way); use tp=1 "
                        f"(FSDP) or a layout file (--{side}-layout FILE)")
    dp = ps.dp if ps.dp is not None else (world_size // tp if world_size and world_size % tp == 0 else 1)
    if world_size is not None and dp * tp != world_size:
        problems.append(f"world size tp({tp}) x dp({dp}) = {dp * tp} ranks, but {world_size} were given")
    if problems:
        raise LayoutError(problems)
    mesh = Mesh.of((dp, tp), ("dp", "tp"))
    col, row, rep = (Replicate(), Shard(0)), (Replicate(), Shard(1)), (Replicate(), Replicate())
    explicit = {}
    for t in model.tensors:
        pl = col if t.kind in _COLUMN else row if t.kind in _ROW else rep
        explicit[t.name] = to_template(t.shape, mesh, pl, what=t.name)
    return DTensorLayout(model, side, dp * tp, explicit=explicit,  # type: ignore[arg-type]
                         source=f"--{side} {ps} (dtensor mesh dp={dp},tp={tp})")

