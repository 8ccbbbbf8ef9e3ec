"""Every public end-to-end refit figure found, beside what reshardctl predicts for the same model, layouts and
hardware (docs/cost-model.md, "Predicted vs published"). Nothing here is fitted: the predictions use the site
profiles' datasheet figures and the cost model's defaults, as ``reshardctl plan`` does.

Two paths were published:

* NeMo RL's default non-colocated refit (``collective``): predicted by ``plan/engine_cost.py``
  (``plan --json`` ``framework_refit``) with NeMo RL's buffer (``NRL_REFIT_BUFFER_MEMORY_RATIO`` 0.02 of an
  80 GiB H100: ``--bucket-mb 1638.4``) and its two buffers, or one for the figure taken before PR 1379;
* NeMo RL's ``nccl_reshard`` (FFN and expert tensors through NCCL M2N, then the rest through the packed
  broadcast): ``plan/engine_cost.py`` ``nccl_reshard_refit`` on the ``hybrid`` plan (``plan --transport
  hybrid --json`` ``framework_refit.nccl_reshard``): its rounds for the bulk path, the collective path's terms
  for the tensors it broadcasts. The rows taken from PR 2971 ran NeMo RL's Python fallback of ``xferdtensor``
  and PR 2808's an earlier NCCL-Xfer build: the same split, other bulk transports.

A row without a prediction says why. ``LARGE`` rows plan 45,000 tensors over 256 + 256 ranks (seconds each):
tests/plan/test_published_refits.py checks them with ``RESHARDCTL_TEST_SLOW=1``.

    PYTHONPATH=. .venv/bin/python benchmarks/published_refits.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

NRL = "https://github.com/NVIDIA-NeMo/RL"
DOC = f"{NRL}/blob/7ea279abf/docs/design-docs/nccl-reshard-refit.md"  # "Expected Performance"
PR1379, PR2971, PR2808 = f"{NRL}/pull/1379", f"{NRL}/pull/2971", f"{NRL}/pull/2808"
H100_BUFFER_MB = 0.02 * 80 * 1024  # packed_tensor.py:23-31: 0.02 x total GPU memory (80 GiB), capped at 5 GiB
PR638_BUFFER_MB = 0.2 * 80 * 1024  # before PR 1379 one buffer of NRL_REFIT_BUFFER_MEMORY_RATIO 0.2 (PR 638)
DSV3_TRAIN = "pp=16,ep=16,first=3,last=2"  # NeMo RL grpo-deepseek-v3-32n8g: pp 16, ep 16, first 3 / last 2 layers
Q235_TRAIN = "tp=4,pp=8,ep=16,etp=1,first=11,last=11"  # grpo-qwen3-235b-16n8g / -32n8g-async-1off


@dataclass(frozen=True)
class Row:
    source: str
    what: str  # the figure, as published
    model: str  # reshardctl catalog preset ("" when not in the catalog)
    layouts: str  # as published
    hardware: str
    published: tuple[float, float]  # seconds (low, high); a single figure twice
    path: str  # "collective" | "hybrid"
    site: str = "dgx-h100"
    train: str = ""
    infer: str = ""
    buffers: int = 2
    bucket_mb: float | None = None
    no_prediction: str = ""  # why there is none
    large: bool = False


ROWS = (
    Row(PR1379, "DSV3 after PR 1379 (2 buffers)", "deepseek-v3", "PP16xEP16 -> TP32xDP8 (recipe, assumed)",
        "H100, 32 + 32 nodes", (14.0, 14.0), "collective", train=DSV3_TRAIN, infer="tp=32,dp=8",
        bucket_mb=H100_BUFFER_MB),
    Row(PR1379, "DSV3 before PR 1379 (1 buffer)", "deepseek-v3", "PP16xEP16 -> TP32xDP8 (recipe, assumed)",
        "H100, 32 + 32 nodes", (34.0, 34.0), "collective", train=DSV3_TRAIN, infer="tp=32,dp=8", buffers=1,
        bucket_mb=PR638_BUFFER_MB),
    Row(PR1379, "Qwen3-235B after PR 1379 (2 buffers)", "qwen3-235b-a22b", "TP4xPP8xEP16 -> TP8xDP16 (recipe, assumed)",
        "H100, 16 + 16 nodes", (5.5, 5.5), "collective", train=Q235_TRAIN, infer="tp=8,dp=16",
        bucket_mb=H100_BUFFER_MB),
    Row(PR1379, "Qwen3-235B before PR 1379 (1 buffer)", "qwen3-235b-a22b", "TP4xPP8xEP16 -> TP8xDP16 (recipe, assumed)",
        "H100, 16 + 16 nodes", (13.0, 13.0), "collective", train=Q235_TRAIN, infer="tp=8,dp=16", buffers=1,
        bucket_mb=PR638_BUFFER_MB),
    Row(DOC, "nccl_reshard, Qwen3-4B", "", "DP8 -> TP8", "H100", (0.21, 0.34), "hybrid",
        no_prediction="Qwen3-4B is not in the model catalog"),
    Row(DOC, "nccl_reshard, Qwen3-30B", "qwen3-30b-a3b", "EP8xPP2 -> TP8xDP2", "H100, 2 + 2 nodes", (0.74, 1.00),
        "hybrid", train="pp=2,ep=8,etp=1", infer="tp=8,dp=2"),
    Row(DOC, "nccl_reshard, Qwen3-30B FP8", "qwen3-30b-a3b", "EP8xDP2 -> TP2xDP8", "H100", (2.90, 4.00), "hybrid",
        no_prediction="FP8 generation: the receiver quantizes each tensor after it lands, which is not modelled"),
    Row(DOC, "nccl_reshard, DSV3", "deepseek-v3", "PP16xEP16 -> TP32xDP8", "H100, 32 + 32 nodes", (2.39, 2.83),
        "hybrid", train=DSV3_TRAIN, infer="tp=32,dp=8", large=True),
    Row(DOC, "nccl_reshard, Qwen3.5-397B", "", "TP8xPP8xEP32 -> TP16xDP16", "H100", (1.97, 2.17), "hybrid",
        no_prediction="Qwen3.5-397B is not in the model catalog"),
    Row(DOC, "nccl_reshard, DSV3", "deepseek-v3", "PP16xEP16 -> TP32xDP8", "GB200", (1.93, 2.59), "hybrid",
        site="gb200-nvl72", no_prediction="the gb200-nvl72 profile has 36 nodes of 4 GPUs; 256 + 256 ranks need 128"),
    Row(DOC, "nccl_reshard, Nemotron Ultra-v3", "", "TP8xEP32xPP2 -> TP8xDP8", "GB200", (2.32, 2.32), "hybrid",
        no_prediction="Nemotron Ultra-v3 is not in the model catalog"),
    Row(PR2971, "xferdtensor python fallback, 30B", "qwen3-30b-a3b", "EP4xTP2xDP2 -> TP4xDP4", "DGX-H100",
        (1.13, 1.53), "hybrid", train="tp=2,ep=4,etp=1", infer="tp=4,dp=4"),
    Row(PR2971, "xferdtensor python fallback, 30B", "qwen3-30b-a3b", "EP4xTP2xPP2 -> TP4xDP4", "DGX-H100",
        (0.74, 1.17), "hybrid", train="tp=2,pp=2,ep=4,etp=1", infer="tp=4,dp=4"),
    Row(PR2971, "xferdtensor python fallback, 30B", "qwen3-30b-a3b", "EP8xPP2 -> TP2xDP8", "DGX-H100",
        (1.21, 1.52), "hybrid", train="pp=2,ep=8,etp=1", infer="tp=2,dp=8"),
    Row(PR2971, "xferdtensor python fallback, 30B", "qwen3-30b-a3b", "EP8xPP2 -> TP8xDP2", "DGX-H100",
        (0.74, 1.00), "hybrid", train="pp=2,ep=8,etp=1", infer="tp=8,dp=2"),
    Row(PR2971, "xferdtensor python fallback, 30B", "qwen3-30b-a3b", "TP2xCP2xEP8 -> TP4xDP4", "DGX-H100",
        (1.02, 1.45), "hybrid", train="tp=2,cp=2,ep=8,etp=1", infer="tp=4,dp=4"),
    Row(PR2808, "NCCL-Xfer, 30B", "qwen3-30b-a3b", "EP4xTP2xDP2 -> TP4xDP4", "H100", (0.54, 0.67), "hybrid",
        train="tp=2,ep=4,etp=1", infer="tp=4,dp=4"),
    Row(PR2808, "NCCL-Xfer, 30B", "qwen3-30b-a3b", "EP4xTP2xPP2 -> TP4xDP4", "H100", (0.48, 0.52), "hybrid",
        train="tp=2,pp=2,ep=4,etp=1", infer="tp=4,dp=4"),
    Row(PR2808, "NCCL-Xfer, 30B", "qwen3-30b-a3b", "EP8xPP2 -> TP2xDP8", "H100", (0.51, 0.55), "hybrid",
        train="pp=2,ep=8,etp=1", infer="tp=2,dp=8"),
    Row(PR2808, "NCCL-Xfer, 30B", "qwen3-30b-a3b", "EP8xPP2 -> TP8xDP2", "H100", (0.50, 0.51), "hybrid",
        train="pp=2,ep=8,etp=1", infer="tp=8,dp=2"),
    Row(PR2808, "NCCL-Xfer, 235B", "qwen3-235b-a22b", "TP4xPP8xEP16 -> TP8xDP16", "H100, 16 + 16 nodes",
        (4.56, 4.85), "hybrid", train=Q235_TRAIN, infer="tp=8,dp=16", large=True),
    Row(PR2808, "NCCL-Xfer, DSV3", "deepseek-v3", "PP16xEP16 -> TP32xDP8", "H100, 32 + 32 nodes", (7.65, 9.94),
        "hybrid", train=DSV3_TRAIN, infer="tp=32,dp=8", large=True),
)


def _inputs(row: Row, _cache: dict = {}):  # noqa: B006 (one resolved model and layouts per distinct row inputs)
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare

    transport = "hybrid" if row.path == "hybrid" else "gather_broadcast"
    key = (row.site, row.model, row.train, row.infer, transport, row.bucket_mb)
    if key not in _cache:
        _cache[key] = prepare(RefitRequest(site=row.site, model=row.model, train=row.train, infer=row.infer,
                                           transport=transport, bucket_mb=row.bucket_mb))
    return _cache[key]


def predict(row: Row, _cache: dict = {}) -> float | None:  # noqa: B006 (one prediction per distinct row inputs)
    """reshardctl's prediction for the row (seconds), or None where ``no_prediction`` says why."""
    if row.no_prediction:
        return None
    key = (row.path, row.site, row.model, row.train, row.infer, row.buffers, row.bucket_mb)
    if key not in _cache:
        inp = _inputs(row if row.path == "hybrid" else Row(**{**row.__dict__, "bucket_mb": None}))
        bucket = int(row.bucket_mb * (1 << 20)) if row.bucket_mb else inp.bucket_bytes
        if row.path == "collective":
            from reshardctl.plan.engine_cost import framework_refit

            _cache[key] = framework_refit(inp.model, inp.train, inp.infer, inp.topology, inp.links,
                                          buffer_bytes=bucket, buffers=row.buffers)["predicted_s"]
        else:
            from reshardctl.plan.engine_cost import nccl_reshard_refit
            from reshardctl.plan.planner import build_plan

            plan = build_plan(inp.model, inp.train, inp.infer, inp.topology, transport="hybrid",
                              bucket_bytes=inp.bucket_bytes, relay=inp.relay, broadcast_span=inp.broadcast_span)
            _cache[key] = nccl_reshard_refit(plan, inp.links, buffer_bytes=inp.bucket_bytes)["predicted_s"]
    return _cache[key]


def command(row: Row) -> str:
    """The ``reshardctl plan`` command whose ``--json`` holds the row's prediction."""
    if row.no_prediction:
        return ""
    bucket = f" --bucket-mb {row.bucket_mb:g}" if row.bucket_mb else ""
    transport = "hybrid" if row.path == "hybrid" else "gather_broadcast"
    key = "nccl_reshard" if row.path == "hybrid" else "collective"
    note = "" if row.buffers == 2 else \
        f" (framework_refit.{key} with buffers={row.buffers}: benchmarks/published_refits.py)"
    return (f"reshardctl plan --site {row.site} --model {row.model} --train {row.train} --infer {row.infer} "
            f"--transport {transport}{bucket} --json: framework_refit.{key}.predicted_s{note}")


def fmt_published(p: tuple[float, float]) -> str:
    return f"{p[0]:g}" if p[0] == p[1] else f"{p[0]:g}-{p[1]:g}"


def markdown(rows=ROWS) -> str:
    out = ["| source | figure | model | layouts | hardware | path | published s | predicted s | "
           "predicted / published |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = predict(r)
        mid = (r.published[0] + r.published[1]) / 2
        path = r.path + (f" ({r.buffers} buffer{'s' if r.buffers > 1 else ''})" if r.path == "collective" else "")
        pred, ratio = ("-", r.no_prediction) if p is None else (f"{p:.3g}", f"{p / mid:.2f}")
        out.append(f"| {r.source} | {r.what} | {r.model or '-'} | {r.layouts} | {r.hardware} | {path} | "
                   f"{fmt_published(r.published)} | {pred} | {ratio} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.json:
        print(json.dumps([{**r.__dict__, "predicted_s": predict(r), "command": command(r)} for r in ROWS], indent=2))
    else:
        print(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
