"""Staging copies of every rank in the MoE and tp2,pp2 cases of refit_local.py, this tree against a
base tree's ``span_copy.py`` (issue 10): every staged message of every step packed into a block (a
trainer) or landed and read back (an inference rank), the base's way (an index where every region is
one contiguous range, else ``read_into`` / ``write_from`` per region) and this tree's (``MessageCopy``),
alternating, 7 repeats, medians; one process, one thread. Checks that both give the same bytes.

    .venv/bin/python benchmarks/staging_copies.py --base /path/to/base/tree/reshardctl/runtime/span_copy.py

(the base file must have the pre-column-slice API: ``chunk_index(local, regions, device)``,
``gather``, ``scatter``).
"""
import argparse
import importlib.util
import time

import torch

torch.set_num_threads(1)
ap = argparse.ArgumentParser()
ap.add_argument("--base", required=True, help="the base tree's reshardctl/runtime/span_copy.py")
args = ap.parse_args()
from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import prepare
from reshardctl.runs.session import plan_transports
from reshardctl.runtime.program import compile_program
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.executor import arena_place
from reshardctl.runtime import span_copy
spec = importlib.util.spec_from_file_location("old_span_copy", args.base)
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
for model, train, infer in (("tiny-qwen3-moe", "ep=4", "tp=4"), ("tiny-llama", "tp=2,pp=2", "tp=2,dp=2")):
    inp = prepare(RefitRequest(model=model, train=train, infer=infer))
    plan = plan_transports(inp, ["reshard"])["reshard"]
    for rank in range(plan.train_world + plan.infer_world):
        prog = compile_program(plan, rank)
        side = "recvs" if rank >= plan.train_world else "sends"
        w = LocalWeights.in_arena(plan.model, prog.holdings, "cpu", order=prog.order)
        w.arena.copy_(torch.randint(0, 256, w.arena.shape, dtype=torch.uint8))
        msgs = [m for st in prog.steps for x in getattr(st, side) for m in x.messages if arena_place(w, m) is None]
        nbytes = sum(m.nbytes for m in msgs)
        block = torch.empty(max(nbytes, 8) + 8 * len(msgs), dtype=torch.uint8)
        offs, o = [], 0
        for m in msgs:
            offs.append(o); o = (o + m.nbytes + 7) & ~7
        olds = [old.chunk_index(w, m.regions, "cpu") for m in msgs]
        news = [span_copy.copy_spec(w, m.regions, m.offsets) for m in msgs]
        news = [span_copy.MessageCopy(s, "cpu") if s is not None else None for s in news]
        def run_old():
            for m, o, cp in zip(msgs, offs, olds):
                v = block[o:o + m.nbytes]
                if cp is not None:
                    if side == "recvs":
                        old.scatter(w.arena, cp[0], cp[1], v)
                    old.gather(w.arena, cp[0], cp[1], v)
                else:
                    for r, ro in zip(m.regions, m.offsets):
                        if side == "recvs":
                            w.write_from(r.tensor, r.box, v[ro:ro + r.nbytes])
                        w.read_into(r.tensor, r.box, v[ro:ro + r.nbytes])
        def run_new():
            for m, o, cp in zip(msgs, offs, news):
                v = block[o:o + m.nbytes]
                if cp is not None:
                    if side == "recvs":
                        cp.scatter(w, v)
                    cp.gather(w, v)
                else:
                    for r, ro in zip(m.regions, m.offsets):
                        if side == "recvs":
                            w.write_from(r.tensor, r.box, v[ro:ro + r.nbytes])
                        w.read_into(r.tensor, r.box, v[ro:ro + r.nbytes])
        run_old(); a = block.clone(); run_new(); assert torch.equal(a, block)
        t = {"old": [], "new": []}
        for _ in range(7):
            for k, f in (("old", run_old), ("new", run_new)):
                s = time.perf_counter(); f(); t[k].append(time.perf_counter() - s)
        med = {k: sorted(v)[3] * 1e3 for k, v in t.items()}
        calls_old = sum(1 if cp is not None else len(m.regions) for m, cp in zip(msgs, olds))
        calls_new = sum(cp.calls if cp is not None else len(m.regions) for m, cp in zip(msgs, news))
        if not msgs:
            continue
        print(f"{model} {train}->{infer} {side} rank {rank}: {len(msgs)} staged messages, {nbytes/2**20:.1f} MiB; "
              f"copy calls {calls_old} -> {calls_new}; pack/land {med['old']:.1f} -> {med['new']:.1f} ms (median of 7, alternating)", flush=True)
