"""Bind a framework's own parameters on one rank to a plan: the views a refit reads (trainer) or writes
(inference), derived from the side's layout (``local_params``) in the order of the plan's holdings.

    binding = bind(plan, "infer", rank, vllm_model)         # an nn.Module, a {name: tensor} or (name, tensor) pairs
    refitter.refit(step, local_dst=binding.tensors())       # exactly the Refitter's local_dst
    binding.land_copies()                                   # after a commit: duplicate copies written

Nothing is asked of the user: every parameter's name, shape and dtype, and where each HF box sits inside
it, come from the layout (Megatron-core: reshardctl/layout/megatron_params.py; vLLM: layout/vllm.py;
Hugging Face names: ``SideLayout.local_params``). Every problem is collected and raised at once
(``BindingError``). The views are of ``p.detach()``: the parameters' own storage, writable in place
without autograd, with no framework loader call. docs/bindings.md.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from typing import Mapping, Sequence

import torch

from reshardctl.bind.views import segment_index
from reshardctl.errors import BindingError, ReshardError
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.placement import Box, LocalParam
from reshardctl.plan.refit_plan import Plan

MEGATRON_SPECS = ("te", "local")


class Binding:
    """One rank's framework parameters as the refit's tensors: per HF name, one view per box, in the
    order of the plan's holdings. Built once; ``tensors()`` returns the same lists every call (the
    Refitter's fast path compares tensor identities, docs/api.md "Host work per refit")."""

    def __init__(self, side: str, side_rank: int, tensors: dict[str, list[torch.Tensor]],
                 params: tuple[str, ...], device: torch.device,
                 copies: tuple[list[torch.Tensor], list[torch.Tensor]]):
        self.side, self.side_rank = side, side_rank
        self._tensors = tensors
        self.params = params
        self.device = device
        self._copies = copies  # (duplicate views, their primaries' views)

    def tensors(self) -> dict[str, list[torch.Tensor]]:
        """HF name -> one tensor per box (``local_src`` / ``local_dst`` of ``api.Refitter.refit``); the same
        dict and lists every call, do not modify them."""
        return self._tensors

    def land_copies(self) -> None:
        """After a commit: every duplicate copy of a box on this rank (an EPLB redundant slot) written from
        its primary."""
        with torch.no_grad():
            dups, primaries = self._copies
            if dups:
                torch._foreach_copy_(dups, primaries)


def bind(plan: Plan, side: str, side_rank: int, params, *, megatron_spec: str = "te",
         ignore: Sequence[str] = ()) -> Binding:
    """Bind ``params`` (an ``nn.Module``: its ``named_parameters()`` and ``named_buffers()``; a mapping of
    name to tensor; or ``(name, tensor)`` pairs) of side-local rank ``side_rank`` of ``side`` ("train" or
    "infer") to ``plan``. ``megatron_spec``: "te" (Transformer Engine names) or "local" (megatron-core's
    local spec), for a Megatron layout. ``ignore``: regexes (``re.search``) of given parameters that are
    not weights of the exchange (rotary caches, a value head). Raises ``BindingError`` with every problem."""
    if side not in ("train", "infer"):
        raise BindingError([f"side: expected 'train' or 'infer', got {side!r}"], where="bind()")
    layout = plan.train if side == "train" else plan.infer
    where = f"{side} rank {side_rank} ({layout.describe()})"
    if not isinstance(side_rank, int) or not 0 <= side_rank < layout.world_size:
        raise BindingError([f"side_rank: expected 0 <= side_rank < {layout.world_size}, got {side_rank!r}"],
                           where=where)
    if megatron_spec not in MEGATRON_SPECS:
        raise BindingError([f"megatron_spec: expected one of {', '.join(MEGATRON_SPECS)}, got {megatron_spec!r}"],
                           where=where)
    patterns = []
    for p in ignore:
        try:
            patterns.append(re.compile(p))
        except (re.error, TypeError) as e:
            raise BindingError([f"ignore pattern {p!r}: not a regular expression ({e})"], where=where) from None
    # "te" is local_params' default: passed only when another spec is asked for
    kw = {"spec": megatron_spec} if isinstance(layout, MegatronLayout) and megatron_spec != "te" else {}
    expected = layout.local_params(side_rank, **kw)
    given, buffers, problems = _given(params)
    found = _check(expected, given, buffers, patterns, problems, where, module=isinstance(params, torch.nn.Module))
    if problems:
        raise BindingError(problems, where=where)
    holdings = plan.src_holdings(side_rank) if side == "train" else plan.dst_holdings(side_rank)
    named = {plan.model.tensors[i].name: boxes for i, boxes in holdings.items()}
    dtypes = {plan.model.tensors[i].name: plan.model.tensors[i].dtype for i in holdings}
    device = _device(found)
    return _build(side, side_rank, expected, found, named, dtypes, device, where)


def _given(params) -> tuple[dict[str, object], dict[str, object], list[str]]:
    """(parameters, buffers, problems): a module's parameters and buffers; every entry of a mapping or of
    pairs counts as a parameter."""
    problems: list[str] = []
    if isinstance(params, torch.nn.Module):
        return dict(params.named_parameters()), dict(params.named_buffers()), problems
    if isinstance(params, Mapping):
        return dict(params), {}, problems
    given: dict[str, object] = {}
    try:
        for name, t in params:
            if name in given:
                problems.append(f"{name}: given twice")
            given[name] = t
    except (TypeError, ValueError):
        raise BindingError(["params: expected an nn.Module, a mapping of name to tensor or (name, tensor) pairs, "
                            f"got {type(params).__name__}"], where="bind()") from None
    return given, {}, problems


def _check(expected: list[LocalParam], given: Mapping[str, object], buffers: Mapping[str, object],
           patterns: list[re.Pattern], problems: list[str], where: str, *, module: bool) -> dict[str, torch.Tensor]:
    """The expected parameters found (name -> tensor); every problem appended to ``problems``. From a module
    (``module``), a layout buffer (``LocalParam.buffer``) is taken from its buffers only: one registered as a
    parameter is refused (another model than the one the layout describes); a mapping or pairs carry no
    parameter/buffer distinction."""
    found: dict[str, torch.Tensor] = {}
    names = {lp.name for lp in expected}
    offered = sorted(set(given) | set(buffers))
    for lp in expected:
        if module and lp.buffer and lp.name not in buffers and lp.name in given:
            problems.append(f"{lp.name}: expected a buffer (the framework registers it with register_buffer, "
                            f"docs/bindings.md), got an nn.Parameter: the model is not built as the layout "
                            f"describes (an optimizer would also step it)")
            continue
        t = buffers.get(lp.name) if (module and lp.buffer) else given.get(lp.name, buffers.get(lp.name))
        if t is None:
            close = difflib.get_close_matches(lp.name, [n for n in offered if n not in names], n=1)
            hint = f"; closest given: {close[0]}" if close else ""
            problems.append(f"{lp.name}: expected a {lp.dtype} {'buffer' if lp.buffer else 'parameter'} of shape "
                            f"{tuple(lp.shape)}, got nothing of that name{hint}")
            continue
        if not isinstance(t, torch.Tensor):
            problems.append(f"{lp.name}: expected a tensor, got {type(t).__name__}")
            continue
        if callable(getattr(t, "to_local", None)):  # a DTensor (FSDP2, a TP plan): its shard on this rank
            t = t.to_local()
        if tuple(t.shape) != tuple(lp.shape):
            problems.append(f"{lp.name}: shape expected {tuple(lp.shape)}, got {tuple(t.shape)}")
        got_dtype = str(t.dtype).removeprefix("torch.")
        if got_dtype != lp.dtype:
            problems.append(f"{lp.name}: dtype expected torch.{lp.dtype}, got torch.{got_dtype}")
        found[lp.name] = t
    for name in sorted(set(given) - names):
        if not any(p.search(name) for p in patterns):
            problems.append(f"{name}: not a parameter of {where} (expected none of that name; "
                            "pass ignore=[regex] for parameters outside the exchange)")
    if found:
        counts = Counter(t.device for t in found.values())
        common = counts.most_common(1)[0][0]
        for name, t in found.items():
            if t.device != common:
                problems.append(f"{name}: device expected {common} (where {counts[common]} of "
                                f"{len(found)} bound tensors are), got {t.device}")
    return found


def _device(found: Mapping[str, torch.Tensor]) -> torch.device:
    return next(iter(found.values())).device if found else torch.device("cpu")


def _build(side: str, side_rank: int, expected: list[LocalParam], found: Mapping[str, torch.Tensor],
           named: Mapping[str, tuple[Box, ...]], dtypes: Mapping[str, str], device: torch.device,
           where: str) -> Binding:
    """The views, in holdings order; a layout whose segments and holdings disagree is an internal error
    (a reshardctl bug, both named)."""
    internal: list[str] = []
    segments: dict[tuple[str, Box], list[tuple[torch.Tensor, LocalParam]]] = {}  # -> (view, parameter)
    for lp in expected:
        param, shape = found[lp.name].detach(), tuple(lp.shape)
        for seg in lp.segments:
            index = segment_index(seg, shape)
            if isinstance(index, str):
                internal.append(index)
            elif seg.param != lp.name:
                internal.append(f"segment of {seg.hf_name} box {seg.box} names {seg.param}, inside {lp.name}")
            else:
                segments.setdefault((seg.hf_name, seg.box), []).append((param[index], lp))
    tensors: dict[str, list[torch.Tensor]] = {}
    unsupported: list[str] = []
    used: Counter = Counter()
    for hf_name, boxes in named.items():
        out = tensors[hf_name] = []
        for box in boxes:
            key = (hf_name, box)
            segs = segments.get(key, ())
            if used[key] >= len(segs):
                internal.append(f"{hf_name} box {box}: held by {where} in the plan, but no parameter segment "
                                f"of the layout holds it")
                continue
            view, lp = segs[used[key]]
            used[key] += 1
            if lp.dtype != dtypes[hf_name]:  # the refit moves the checkpoint's bytes, never converts them
                why = ("a cast to or from float8 needs the checkpoint's block scales, which bind does not compute"
                       if "float8" in lp.dtype or "float8" in dtypes[hf_name] else
                       "the refit moves the checkpoint dtype's bytes and does not convert them")
                unsupported.append(f"{lp.name}: holds {hf_name} ({dtypes[hf_name]}) as {lp.dtype}: {why}")
                continue
            out.append(view)
    copies: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    for key, segs in segments.items():
        if key[0] not in named or used[key] == 0:
            internal.append(f"{key[0]} box {key[1]}: a segment in {segs[0][1].name}, but the plan's holdings of "
                            f"{where} do not hold it")
            continue
        for view, _ in segs[used[key]:]:  # the same box again on this rank: a duplicate copy
            copies[0].append(view)
            copies[1].append(segs[0][0])
    if internal:
        raise ReshardError(f"internal error binding {where} (a reshardctl layout bug, please report):\n"
                           + "\n".join(f"  - {p}" for p in sorted(internal)))
    if unsupported:
        raise BindingError(unsupported, where=where)
    bound = tuple(lp.name for lp in expected)
    return Binding(side, side_rank, tensors, bound, device, copies)
