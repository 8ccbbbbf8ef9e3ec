"""Pipeline splits: which decoder layers each pipeline (and virtual pipeline) stage builds.

One function per framework rule, each a pure function of the sizes that appends violations (with their
arithmetic) to ``problems`` instead of raising, so a layout reports every problem at once.

* Megatron-Core (``megatron_chunks``), rules from
  ``megatron/core/transformer/transformer_block.py::get_num_layers_to_build`` (how many layers a
  (pp rank, vp stage) builds) and ``transformer_layer.py::get_transformer_layer_offset`` (its first global
  layer): even split; ``num_layers_in_first/last_pipeline_stage`` with the rest even over the middle
  stages, also with virtual pipeline (each stage's count divided by vpp, offsets interleaved);
  ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split`` (the embedding /
  loss counts as a layer of the first / last virtual stage); and ``pipeline_model_parallel_layout``
  (``transformer/pipeline_parallel_layer_layout.py::PipelineParallelLayerLayout``: stage strings of
  ``E`` embedding, ``t`` decoder, ``m`` MTP, ``L`` loss, ``|`` between stages, ``(..)*n`` / ``x*n``
  repeats; stage list index ``vp*PP + pp``).
* vLLM (``vllm_pp_parts``): ``vllm/distributed/utils.py::get_pp_indices``: ``[L//PP]*PP`` with the
  remainder on the stages just before the last, or ``VLLM_PP_LAYER_PARTITION``.
* SGLang (``sglang_pp_parts``): ``python/sglang/srt/distributed/utils.py::get_pp_indices``: the LAST
  ``L % PP`` stages get one more layer, or ``SGLANG_PP_LAYER_PARTITION``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reshardctl.layout.shard_rules import frac

Chunks = list[list[list[int]]]  # [pp rank][vp stage] -> global decoder layers, in order


@dataclass(frozen=True)
class MegatronPipeline:
    """The decoder layers of every (pp rank, vp stage), and where the MTP block sits."""

    chunks: Chunks
    mtp_stage: tuple[int, int]  # (pp rank, vp stage) holding the MTP layers


def _even_parts(num_layers: int, pp: int, first: int | None, last: int | None, problems: list[str]) -> list[int]:
    """Layers per pipeline rank (no vpp): even (must divide) or first/last overrides, rest even."""
    if first is None and last is None:
        if num_layers % pp:
            problems.append(f"pp={pp} does not divide {num_layers} layers ({frac(num_layers, pp)}; "
                            f"give first_stage_layers/last_stage_layers or pp_layout)")
        return [num_layers // pp] * pp
    if pp == 1:
        problems.append("first_stage_layers/last_stage_layers need pp > 1")
        return [num_layers]
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if rest < 0:
        problems.append(f"first_stage_layers + last_stage_layers = {(first or 0) + (last or 0)} > {num_layers} layers")
        return [0] * pp
    if middle == 0:
        if rest:
            problems.append(f"pp={pp}: first_stage_layers({first}) + last_stage_layers({last}) = "
                            f"{(first or 0) + (last or 0)} != {num_layers} layers")
        per = 0
    elif rest % middle:
        problems.append(f"the {rest} layers left after the first/last-stage overrides do not split evenly "
                        f"over the {middle} other stages ({frac(rest, middle)})")
        per = rest // middle
    else:
        per = rest // middle
    parts = [per] * pp
    if first is not None:
        parts[0] = first
    if last is not None:
        parts[-1] = last
    return parts


def megatron_chunks(num_layers: int, pp: int, vpp: int, *, first: int | None = None, last: int | None = None,
                    embed_in_split: bool = False, loss_in_split: bool = False, layout: str | None = None,
                    num_mtp: int = 0, problems: list[str]) -> MegatronPipeline:
    """Megatron's per-(pp, vp) decoder layers (see the module docstring for the source functions)."""
    last_stage = (pp - 1, vpp - 1)
    if layout is not None:
        if first is not None or last is not None or embed_in_split or loss_in_split:
            problems.append("pp_layout overrides first/last_stage_layers and embedding/loss_in_split: give one")
        return _layout_chunks(layout, num_layers, pp, vpp, num_mtp, problems)
    if (embed_in_split or loss_in_split) and (first is not None or last is not None):
        problems.append("embedding_in_split/loss_in_split cannot be combined with first/last_stage_layers "
                        "(Megatron: 'Does not support standalone embedding stage and standalone loss stage "
                        "with uneven pp')")
        return MegatronPipeline([[[] for _ in range(vpp)] for _ in range(pp)], last_stage)
    if pp == 1:
        if vpp > 1:
            problems.append(f"vpp={vpp} needs pp > 1")
        return MegatronPipeline([[list(range(num_layers))] + [[] for _ in range(vpp - 1)]], last_stage)
    if embed_in_split or loss_in_split:
        n = num_layers + embed_in_split + loss_in_split
        if n % pp:
            problems.append(f"pp={pp} does not divide {num_layers} layers + {int(embed_in_split)} embedding + "
                            f"{int(loss_in_split)} loss = {n} ({frac(n, pp)})")
        per_rank = n // pp
        if per_rank % vpp:
            problems.append(f"vpp={vpp} does not divide the {per_rank} layers per pipeline rank "
                            f"({frac(per_rank, vpp)})")
        c = per_rank // vpp
        chunks: Chunks = []
        for r in range(pp):
            row = []
            for s in range(vpp):
                first_v, last_v = (r, s) == (0, 0), (r, s) == last_stage
                offset = s * (n // vpp) + r * c - (1 if embed_in_split and not first_v else 0)
                count = c - (1 if embed_in_split and first_v else 0) - (1 if loss_in_split and last_v else 0)
                if count < 0:
                    problems.append(f"pp rank {r} vp stage {s}: {c} layer slots leave no room for the "
                                    f"embedding/loss")
                    count = 0
                row.append(list(range(offset, offset + count)))
            chunks.append(row)
        return _checked(MegatronPipeline(chunks, last_stage), num_layers, problems)
    parts = _even_parts(num_layers, pp, first, last, problems)
    if vpp == 1:
        chunks, g = [], 0
        for n in parts:
            chunks.append([list(range(g, g + n))])
            g += n
        return _checked(MegatronPipeline(chunks, last_stage), num_layers, problems)
    for r, n in enumerate(parts):
        if n % vpp:
            which = "first" if (r == 0 and first is not None) else "last" if (r == pp - 1 and last is not None) \
                else "middle"
            problems.append(f"vpp={vpp} does not divide the {n} layers of the {which} pipeline stage "
                            f"(pp rank {r}: {frac(n, vpp)})")
            return MegatronPipeline([[[] for _ in range(vpp)] for _ in range(pp)], last_stage)
    if first is None and last is None:  # Megatron's interleaved offset: (s*PP + r) * c
        c = num_layers // (pp * vpp)
        chunks = [[list(range((s * pp + r) * c, (s * pp + r + 1) * c)) for s in range(vpp)] for r in range(pp)]
        return _checked(MegatronPipeline(chunks, last_stage), num_layers, problems)
    # uneven first/last with vpp: get_transformer_layer_offset's interleaved uneven branch
    middle_stages = pp - (first is not None) - (last is not None)
    if middle_stages == 0:
        problems.append(f"vpp={vpp} with first_stage_layers and last_stage_layers on pp={pp} leaves no middle "
                        f"stage; Megatron's get_transformer_layer_offset divides by the middle stage count (0)")
        return MegatronPipeline([[[] for _ in range(vpp)] for _ in range(pp)], last_stage)
    f_c = (first or 0) // vpp
    l_c = (last or 0) // vpp
    mid_total = num_layers - (first or 0) - (last or 0)
    m_c = mid_total // vpp
    total = f_c + m_c + l_c
    chunks = []
    for r in range(pp):
        row = []
        mid_rank = r if first is None else r - 1
        for s in range(vpp):
            if r == 0:
                offset = s * total
            else:
                offset = s * total + f_c + mid_rank * (m_c // middle_stages)
            row.append(list(range(offset, offset + parts[r] // vpp)))
        chunks.append(row)
    return _checked(MegatronPipeline(chunks, last_stage), num_layers, problems)


def _checked(p: MegatronPipeline, num_layers: int, problems: list[str]) -> MegatronPipeline:
    """Every decoder layer exactly once (a guard on the arithmetic, reported, never silently wrong)."""
    if problems:
        return p
    seen = sorted(g for row in p.chunks for c in row for g in c)
    if seen != list(range(num_layers)):
        problems.append(f"the pipeline split does not place each of the {num_layers} layers exactly once "
                        f"({len(seen)} placed)")
    return p


_LAYOUT_CHARS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}


def parse_pp_layout(text: str) -> list[list[str]]:
    """``PipelineParallelLayerLayout.parse_str_to_list``: commas dropped, ``(..)*n`` and ``x*n`` unrolled,
    split on ``|``; returns one list of layer characters per (virtual) stage."""
    s = text.replace(",", "").replace(" ", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return [list(stage) for stage in s.split("|")]


def _layout_chunks(text: str, num_layers: int, pp: int, vpp_given: int, num_mtp: int,
                   problems: list[str]) -> MegatronPipeline:
    empty = MegatronPipeline([[[]] for _ in range(pp)], (pp - 1, 0))
    stages = parse_pp_layout(text)
    bad = sorted({ch for st in stages for ch in st if ch not in _LAYOUT_CHARS})
    if bad:
        problems.append(f"pp_layout {text!r}: unknown layer character(s) {', '.join(map(repr, bad))} "
                        f"(known: E embedding, t decoder, m MTP, L loss)")
        return empty
    if len(stages) % pp:
        problems.append(f"pp_layout {text!r} has {len(stages)} stages, not a multiple of pp={pp} "
                        f"({frac(len(stages), pp)})")
        return empty
    vpp = len(stages) // pp
    if vpp_given not in (1, vpp):
        problems.append(f"pp_layout {text!r} has {len(stages)} stages = pp({pp}) x {vpp}, but vpp={vpp_given}")
    grid = [[stages[s * pp + r] for s in range(vpp)] for r in range(pp)]
    flat = [ch for s in range(vpp) for r in range(pp) for ch in grid[r][s]]
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        problems.append(f"pp_layout {text!r}: the embedding 'E' must come first, exactly once")
    if not flat or flat[-1] != "L" or flat.count("L") != 1:
        problems.append(f"pp_layout {text!r}: the loss 'L' must come last, exactly once")
    if flat.count("t") != num_layers:
        problems.append(f"pp_layout {text!r} has {flat.count('t')} decoder layers 't', the model {num_layers}")
    if flat.count("m") != num_mtp:
        problems.append(f"pp_layout {text!r} has {flat.count('m')} MTP layers 'm', the model view {num_mtp} "
                        f"(--mtp includes them)")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        problems.append(f"pp_layout {text!r}: decoder layers must come before MTP layers")
    mtp_stage = (pp - 1, vpp - 1)
    for r in range(pp):
        for s in range(vpp):
            if "m" in grid[r][s]:
                if s != vpp - 1:
                    problems.append(f"pp_layout {text!r}: MTP must be in the last virtual stage of its pp rank "
                                    f"(pp rank {r} vp stage {s})")
                mtp_stage = (r, s)
    if problems:
        return MegatronPipeline([[[] for _ in range(vpp)] for _ in range(pp)], mtp_stage)
    chunks: Chunks = [[[] for _ in range(vpp)] for _ in range(pp)]
    g = 0
    for s in range(vpp):  # PipelineParallelLayerLayout.get_layer_offset: layer-id order is vp-major
        for r in range(pp):
            n = grid[r][s].count("t")
            chunks[r][s] = list(range(g, g + n))
            g += n
    return MegatronPipeline(chunks, mtp_stage)


def _explicit_parts(partition: tuple[int, ...], num_layers: int, pp: int, what: str,
                    problems: list[str]) -> list[int] | None:
    if len(partition) != pp:
        problems.append(f"{what} {':'.join(map(str, partition))} has {len(partition)} entries, pp={pp}")
        return None
    if sum(partition) != num_layers:
        problems.append(f"{what} {':'.join(map(str, partition))} sums to {sum(partition)}, "
                        f"the model has {num_layers} layers")
        return None
    return list(partition)


def vllm_pp_parts(num_layers: int, pp: int, partition: tuple[int, ...] | None = None,
                  problems: list[str] | None = None) -> list[int]:
    """vLLM ``get_pp_indices``: ``VLLM_PP_LAYER_PARTITION`` when given, else ``[L//PP]*PP`` with the
    remainder r on the stages just before the last (``parts[-i] += 1 for i in 2..r+1``)."""
    if partition is not None:
        got = _explicit_parts(partition, num_layers, pp, "pp_partition (VLLM_PP_LAYER_PARTITION)",
                              problems if problems is not None else [])
        if got is not None:
            return got
    parts = [num_layers // pp] * pp
    rem = num_layers % pp
    for i in range(2, rem + 2):
        parts[-i] += 1
    return parts


def sglang_pp_parts(num_layers: int, pp: int, partition: tuple[int, ...] | None = None,
                    problems: list[str] | None = None) -> list[int]:
    """SGLang ``get_pp_indices``: ``SGLANG_PP_LAYER_PARTITION`` when given, else ``L//PP`` per stage with
    the last ``L % PP`` stages one more."""
    if partition is not None:
        got = _explicit_parts(partition, num_layers, pp, "pp_partition (SGLANG_PP_LAYER_PARTITION)",
                              problems if problems is not None else [])
        if got is not None:
            return got
    base, rem = divmod(num_layers, pp)
    return [base + (1 if p >= pp - rem else 0) for p in range(pp)]
