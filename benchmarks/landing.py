"""What landing a refit's committed bytes in framework parameters costs (issue 23 item 6), per plan: the
inference rank with the most parameter segments builds its real
framework parameters (``layout.local_params``: vLLM's fused ``qkv_proj`` / ``gate_up_proj``, expert
stacks ``w13_weight`` / ``w2_weight``, MLA) and lands the same bytes two ways, alternating, in one run
(``reshardctl/calibrate/landing.py``):

* direct: one ``torch._foreach_copy_`` from the arena's box views into the parameters' segment views
  (``api.Refitter._commit_copy``);
* loader: ``load_weights(iter((name, whole_tensor)))``, one ``weight_loader`` call per HF tensor that
  narrows the tensor to the rank's boxes and the parameter to the fused offsets, ``param.data...copy_``.

Each path runs twice: with the real shapes (seconds), and with one-element stand-ins of the same
parameters (the host cost alone: µs per segment, µs per loader call); the bytes' cost is the difference
over the bytes. Both paths are checked to land identical parameters. One process, one thread (a rank).
Three alternating rounds, each the median of ``--reps`` timed calls after a warm-up; the median round.
Also prints the cost model's landing term for the rank (the profile's default constants, the measured
copy rate).

    PYTHONPATH=. .venv/bin/python benchmarks/landing.py [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import torch

from reshardctl.api import plan_refit
from reshardctl.calibrate.landing import build, land_direct, land_loader, timed
from reshardctl.plan.cost import Links, landing_seconds
from reshardctl.plan.stats import landing_counts
from reshardctl.site import load_profile

ROUNDS = 3  # alternating rounds of both paths; each path's figure: the median of its rounds' medians
CASES = [  # (model, layers, train, infer)
    ("tiny-llama", None, "tp=2", "tp=2"),
    ("tiny-qwen3-moe", None, "tp=2", "tp=2"),
    ("tiny-qwen3-moe", None, "tp=2", "tp=2,ep=2"),
    ("tiny-deepseek", None, "tp=2", "tp=2"),
    ("qwen3-30b-a3b", 2, "tp=2,ep=2,etp=1", "tp=2,ep=2"),
]


def measure(model: str, layers, train: str, infer: str, reps: int) -> dict:
    plan = plan_refit(model=model, layers=layers, train=train, infer=infer)
    c = landing_counts(plan)
    r = int(c.views.argmax())
    lps = plan.infer.local_params(r)
    shapes = {t.name: tuple(t.shape) for t in plan.model.tensors}
    real = build(lps, shapes)
    host = build(lps, shapes, one_element=True)
    assert (real.num_views, real.num_tensors, real.nbytes) == (c.views[r], c.tensors[r], c.nbytes[r])
    # both paths land the same bytes
    land_direct(real)
    direct_params = {k: v.clone() for k, v in real.params.items()}
    for p in real.params.values():
        p.zero_()
    land_loader(real)
    assert all(torch.equal(direct_params[k], v) for k, v in real.params.items()), "loader and direct differ"
    del direct_params
    t = {}
    for _ in range(ROUNDS):  # alternate, so drift on a shared machine hits both
        for name, fn in (("direct", land_direct), ("loader", land_loader)):
            t.setdefault(("real", name), []).append(timed(fn, real, reps))
            t.setdefault(("host", name), []).append(timed(fn, host, reps))
    med = {k: statistics.median(v) for k, v in t.items()}
    out = {"case": f"{model}{f' layers={layers}' if layers else ''} infer {infer}", "infer_rank": r,
           "segments": real.num_views, "tensors": real.num_tensors, "bytes": real.nbytes,
           "params": len(real.params)}
    for name, calls in (("direct", real.num_views), ("loader", real.num_tensors)):
        total, h = med[("real", name)], med[("host", name)]
        out[name] = {"seconds": total, "host_seconds": h, "us_per_call": h / calls * 1e6,
                     "gbytes_per_s": real.nbytes / max(total - h, 1e-12) / 1e9}
    out["ratio_total"] = out["loader"]["seconds"] / out["direct"]["seconds"]
    out["ratio_host"] = out["loader"]["host_seconds"] / out["direct"]["host_seconds"]
    # the cost model's term for this rank: the profile's default constants (per segment, per loader call)
    # and the copy rate the direct path just reached
    m = dataclasses.replace(Links.from_site(load_profile("local")), copy=out["direct"]["gbytes_per_s"] * 1e9)
    d, l_ = landing_seconds(real.num_views, real.num_tensors, real.nbytes, m)
    out["model"] = {"direct_s": float(d), "loader_s": float(l_)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--case", type=int, action="append", help="only these CASES (by index)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [measure(*CASES[i], args.reps) for i in (args.case or range(len(CASES)))]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    print(f"{'case':44} {'segs':>6} {'tensors':>7} {'MiB':>8} | {'direct ms':>9} {'us/seg':>6} {'GB/s':>5} | "
          f"{'loader ms':>9} {'us/call':>7} {'GB/s':>5} | {'ratio':>5} {'host ratio':>10} | model d/l ms")
    for o in rows:
        d, l_ = o["direct"], o["loader"]
        print(f"{o['case']:44} {o['segments']:6d} {o['tensors']:7d} {o['bytes'] / 2**20:8.1f} | "
              f"{d['seconds'] * 1e3:9.2f} {d['us_per_call']:6.2f} {d['gbytes_per_s']:5.2f} | "
              f"{l_['seconds'] * 1e3:9.2f} {l_['us_per_call']:7.2f} {l_['gbytes_per_s']:5.2f} | "
              f"{o['ratio_total']:5.2f} {o['ratio_host']:10.1f} | "
              f"{o['model']['direct_s'] * 1e3:.2f}/{o['model']['loader_s'] * 1e3:.2f}")


if __name__ == "__main__":
    main()
