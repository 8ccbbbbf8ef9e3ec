"""Host work per refit, counted on every rank of a real refit through the Python API.

The issue's question: does a rank's work per refit grow with its peers and buckets, or with its
tensors and regions? Each case runs ``api.Refitter`` in 4 trainer + 4 inference processes (gloo on
CPU, as an RL framework would call it) and counts, on every rank, during one steady-state refit:

* **torch operations**: every op that reaches the dispatcher (``TorchDispatchMode``): kernels, views,
  copies, the c10d sends and receives. On a GPU each non-view op is a kernel launch or a copy;
* **tensors created** by those ops (their outputs);
* **Python calls** (``sys.setprofile``: Python functions and builtins, every thread);
* **Python lines executed** (``sys.settrace``, a separate refit): a loop over regions or tensors in
  Python shows here whatever it creates;
* **objects kept**: live gc-tracked objects after a refit minus before it (after ``gc.collect()``).

CPython 3.11 has no counter of objects *created* outside debug builds; lines and calls bound the Python
that runs, and tensors created count the objects that matter on a GPU.

Cases: the MoE model with 16, 64 and 256 experts (the expert FFN narrower in proportion, so the bytes
stay the same: 231, 807 and 3,111 regions per rank, 8 messages), ep=4 -> tp=4, by default through the
reshard transport. Printed side by side: per rank the regions and messages of its program and the
counts, and the ratio most / fewest experts on the busiest rank of each side.

    .venv/bin/python benchmarks/host_work.py [--transport reshard|gather_broadcast|hybrid] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from reshardctl import api
from reshardctl.launch.ports import free_port
from reshardctl.models.catalog import preset_config
from reshardctl.runtime.synthetic_weights import synthetic_region

TRAIN, INFER, WORLD = "ep=4", "tp=4", 8
EXPERTS = (16, 64, 256)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = self.tensors = 0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        name = str(func.overloadpacket)
        self.by_op[name] = self.by_op.get(name, 0) + 1
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.tensors += sum(isinstance(o, torch.Tensor) for o in outs)
        return out


def _count_events(fn, events: tuple[str, ...], hooks) -> int:
    """Python events of ``fn()`` in every thread: ``hooks`` are (threading's, sys's) setter, profile
    ("call", "c_call": calls) or trace ("line": lines)."""
    n = [0]

    def hook(frame, event, arg):
        if event in events:
            n[0] += 1
        return hook  # a trace function must return itself to see lines; a profile's return is ignored
    for h in hooks:
        h(hook)
    try:
        fn()
    finally:
        for h in hooks:
            h(None)
    return n[0]


def _count_calls(fn) -> int:
    return _count_events(fn, ("call", "c_call"), (threading.setprofile, sys.setprofile))


def _count_lines(fn) -> int:
    return _count_events(fn, ("line",), (threading.settrace, sys.settrace))


def _rank(rank: int, port: int, cfg: str, transport: str, q) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        plan = api.plan_refit(model=cfg, train=TRAIN, infer=INFER, transport=transport)
        by_name = {t.name: t for t in plan.model.tensors}
        refitter = api.Refitter(plan, timeout_s=120)
        trainer = rank < plan.train_world
        local = {n: [synthetic_region(by_name[n], b, 1 if trainer else 0) for b in boxes]
                 for n, boxes in refitter.holdings().items()}
        step = [0]

        def refit():
            step[0] += 1
            if trainer:
                refitter.refit(step[0], local_src=local)
            else:
                refitter.refit(step[0], local_dst=local)

        refit()
        refit()  # steady state from here: the program, pool and arena exist
        mode = _Ops()
        with mode:
            refit()
        calls = _count_calls(refit)
        lines = _count_lines(refit)
        gc.collect()
        before = len(gc.get_objects())
        refit()
        gc.collect()
        kept = len(gc.get_objects()) - before
        prog = refitter.executor.program
        refitter.close()
        dist.destroy_process_group()
        top = sorted(mode.by_op.items(), key=lambda kv: -kv[1])[:6]
        q.put((rank, dict(side="train" if trainer else "infer", tensors_held=len(local),
                          regions=prog.counts["regions"], messages=prog.counts["p2p_messages"],
                          torch_ops=mode.ops, tensors_created=mode.tensors, python_calls=calls,
                          python_lines=lines, objects_kept=kept, top_ops=top), None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))



def run_case(experts: int, tmp: str, transport: str = "reshard") -> dict[int, dict]:
    cfg = preset_config("tiny-qwen3-moe")
    scale = experts // cfg["num_experts"]
    cfg.update(num_experts=experts, num_experts_per_tok=4,
               moe_intermediate_size=cfg["moe_intermediate_size"] // scale)
    path = os.path.join(tmp, f"moe-{experts}", "config.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(cfg, f)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, path, transport, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        r, res, err = q.get(timeout=600)
        if err:
            raise SystemExit(f"rank {r}: {err}")
        out[r] = res
    for p in procs:
        p.join(timeout=60)
    return dict(sorted(out.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="also write the counts to this file")
    ap.add_argument("--transport", default="reshard", choices=("reshard", "gather_broadcast", "hybrid"))
    args = ap.parse_args()
    cases = {}
    with tempfile.TemporaryDirectory() as tmp:
        for e in EXPERTS:
            cases[e] = run_case(e, tmp, args.transport)
    cols = ("tensors_held", "regions", "messages", "torch_ops", "tensors_created", "python_calls",
            "python_lines", "objects_kept")
    print(f"host work per steady-state refit, tiny-qwen3-moe variants, Megatron {TRAIN} -> vLLM {INFER}, "
          f"{args.transport}, via api.Refitter (4 + 4 gloo processes)")
    print(f"{'experts':>7} {'rank':>4} {'side':>5} " + " ".join(f"{c:>15}" for c in cols))
    for e, ranks in cases.items():
        for r, res in ranks.items():
            print(f"{e:>7} {r:>4} {res['side']:>5} " + " ".join(f"{res[c]:>15,}" for c in cols))
    print(f"\nbusiest rank per side (most torch operations), {EXPERTS[-1]} experts / {EXPERTS[0]} experts:")
    for side in ("train", "infer"):
        busy = {e: max((res for res in ranks.values() if res["side"] == side), key=lambda x: x["torch_ops"])
                for e, ranks in cases.items()}
        lo, hi = busy[EXPERTS[0]], busy[EXPERTS[-1]]
        print(f"  {side}: " + ", ".join(f"{c} {hi[c] / lo[c]:.2f}x" for c in cols[:-1] if lo[c]))
        print(f"    top torch ops at {EXPERTS[-1]} experts: {hi['top_ops']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(e): ranks for e, ranks in cases.items()}, f, indent=1)


if __name__ == "__main__":
    main()
