"""Landing committed bytes in a rank's framework parameters, two ways, timed (the cost model's ``landing`` term).

* **direct** (what ``api.Refitter._commit_copy`` does): every segment of every bound parameter is one view,
  and the whole refit lands with one ``torch._foreach_copy_`` from the arena's box views into them;
* **loader** (a framework's ``model.load_weights(iter((name, tensor)))``, as vLLM's ``weight_loader``s do):
  one Python call per HF tensor, given the tensor whole; the call narrows it to each box the rank holds,
  narrows the parameter to the segment's offsets (the fused ``qkv_proj`` / ``gate_up_proj`` rows, the
  expert slot of a ``w13_weight`` / ``w2_weight`` stack) and copies (``param.data...copy_``). The name
  lookup is one dict look-up (vLLM walks its ``stacked_params_mapping`` with string replaces first), so
  this is the cheapest a loader call can be: the extra it shows is a lower bound on a framework's.

``run_landing`` builds both for one rank's ``LocalParam``s (``layout.local_params(rank)``) and times
them; ``host_cost`` does so with one-element stand-ins, so what remains is the per-view and per-call host
cost (``reshardctl calibrate`` measures that; ``benchmarks/landing.py`` both, on real plans).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from reshardctl.layout.placement import LocalParam, LocalSegment
from reshardctl.runtime.dtypes import torch_dtype

HOST_VIEWS = 2048  # stand-in views (and loader calls) of the host-cost microbenchmark


@dataclass
class Landing:
    """One rank's parameters and, for both paths, what they copy from."""

    params: dict[str, torch.Tensor]
    views: list[torch.Tensor]  # direct: a view of a parameter per segment
    arena: list[torch.Tensor]  # direct: the arena's box views, one per segment (contiguous, back to back)
    loader: dict[str, list[tuple[torch.Tensor, tuple[int, ...], tuple]]]  # hf name -> (param, offset, box)
    full: dict[str, torch.Tensor]  # loader: the HF tensors whole, as a refit's broadcast delivers them
    nbytes: int  # bytes landed (each path copies these)

    @property
    def num_views(self) -> int:
        return len(self.views)

    @property
    def num_tensors(self) -> int:
        return len(self.full)


def _segment_view(param: torch.Tensor, offset: tuple[int, ...], box) -> torch.Tensor:
    """``param[offset...]`` of the box's extent; a stack's extra leading offset picks the expert slot."""
    v = param
    if len(offset) > len(box):
        v = v[offset[0]]
        offset = offset[1:]
    for d, ((lo, hi), off) in enumerate(zip(box, offset)):
        v = v.narrow(d, off, hi - lo)
    return v


def build(local_params: list[LocalParam], shapes: dict[str, tuple[int, ...]], *, device="cpu",
          one_element: bool = False) -> Landing:
    """Both paths for one rank. ``shapes``: HF name -> full shape (the loader's input). ``one_element``:
    every tensor of one element (each view's copy moves 1 element), for the host cost alone."""
    params: dict[str, torch.Tensor] = {}
    views, boxes, loader = [], [], {}
    full: dict[str, torch.Tensor] = {}
    for lp in local_params:
        dt = torch_dtype(lp.dtype)
        p = torch.zeros((1,) * len(lp.shape) if one_element else lp.shape, dtype=dt, device=device)
        params[lp.name] = p
        for s in lp.segments:
            box = tuple((0, 1) for _ in s.box) if one_element else s.box
            off = (0,) * len(s.offset) if one_element else s.offset
            views.append(_segment_view(p, off, box))
            boxes.append((box, dt))
            loader.setdefault(s.hf_name, []).append((p, off, box))
            if s.hf_name not in full:
                shape = (1,) * len(s.box) if one_element else shapes[s.hf_name]
                full[s.hf_name] = _random(shape, dt, device)
    # the arena holds what the loader path narrows out of the whole tensors: both land the same bytes
    arena = [_narrow(full[lp_hf], box).clone() for lp_hf, (box, _dt) in zip(_hf_names(local_params), boxes)]
    nbytes = sum(v.numel() * v.element_size() for v in views)
    return Landing(params, views, arena, loader, full, nbytes)


def _hf_names(local_params: list[LocalParam]) -> list[str]:
    return [s.hf_name for lp in local_params for s in lp.segments]


def _random(shape, dt: torch.dtype, device) -> torch.Tensor:
    if dt.is_floating_point:
        return torch.randn(shape, device=device).to(dt)
    return torch.randint(0, 100, shape, device=device).to(dt)


def _narrow(t: torch.Tensor, box) -> torch.Tensor:
    for d, (lo, hi) in enumerate(box):
        t = t.narrow(d, lo, hi - lo)
    return t


def land_direct(ld: Landing) -> None:
    with torch.no_grad():
        torch._foreach_copy_(ld.views, ld.arena)


def weight_loader(entries, loaded: torch.Tensor) -> None:
    """One call per HF tensor: its boxes narrowed out of the whole tensor into the parameters."""
    for param, offset, box in entries:
        _segment_view(param.data, offset, box).copy_(_narrow(loaded, box))


def load_weights(ld: Landing, weights) -> None:
    """``model.load_weights``: one ``weight_loader`` call per (name, tensor)."""
    params = ld.loader
    with torch.no_grad():
        for name, tensor in weights:
            weight_loader(params[name], tensor)


def land_loader(ld: Landing) -> None:
    load_weights(ld, iter(ld.full.items()))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, ld: Landing, reps: int, device="cpu") -> float:
    """Median seconds of ``fn(ld)`` after one warm-up (synchronized on a GPU)."""
    fn(ld)
    _sync(device)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(ld)
        _sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _median_host(fn, reps: int) -> float:
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def mapping_scan_seconds(n: int, reps: int) -> float:
    """Host seconds of scanning ``n`` entries of an expert-parameter mapping for a name none of them matches: vLLM
    0.33 ``deepseek_v2.py:1763-1766`` (``for mapping in expert_params_mapping: ... if weight_name not in
    chunk_name: continue``), the name-mapping term of ``plan/engine_cost.py``."""
    mapping = [("experts.w13_" if s != "w2" else "experts.w2_", f"experts.{e}.{w}.", e, s)
               for e in range(n // 3 + 1) for s, w in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))][:n]
    name = "model.layers.7.self_attn.kv_b_proj.weight"

    def scan() -> int:
        hits = 0
        for _param_name, weight_name, _expert_id, _shard_id in mapping:
            if weight_name not in name:
                continue
            hits += 1
        return hits

    return _median_host(scan, reps)


def named_parameters_seconds(n: int, reps: int) -> float:
    """Host seconds of ``dict(model.named_parameters())`` over a module tree of ``n`` parameters (8 per leaf
    module): vLLM's ``load_weights`` builds it on every call (``deepseek_v2.py:1642``)."""
    root, layers = torch.nn.Module(), torch.nn.ModuleList()
    for i in range(max(1, n // 8)):
        m = torch.nn.Module()
        for j in range(8):
            m.register_parameter(f"w{j}", torch.nn.Parameter(torch.zeros(1), requires_grad=False))
        layers.append(m)
    root.layers = layers
    return _median_host(lambda: dict(root.named_parameters()), reps)


def host_cost(device="cpu", reps: int = 7, n: int = HOST_VIEWS) -> dict:
    """Host seconds per landed view (direct) and per loader call, from ``n`` one-element parameters of one
    segment each (the bytes negligible): the calibration's ``landing_s_per_view`` and ``loader_s_per_tensor``;
    and, for a framework's ``load_weights`` (``plan/engine_cost.py``), ``n`` name-mapping entries scanned and
    ``n`` parameters walked into a dict: ``mapping_s_per_entry``, ``named_params_s_per_param``."""
    lps = [LocalParam(f"p{i}", (1,), "float32", (LocalSegment(f"t{i}", ((0, 1),), f"p{i}", (0,)),)) for i in range(n)]
    ld = build(lps, {f"t{i}": (1,) for i in range(n)}, device=device, one_element=True)
    d, l_ = timed(land_direct, ld, reps, device), timed(land_loader, ld, reps, device)
    return {"views": n, "direct_seconds": d, "loader_seconds": l_,
            "mapping_seconds": mapping_scan_seconds(n, reps), "named_params_seconds": named_parameters_seconds(n, reps)}

