#!/usr/bin/env python3
"""reshardctl inside an RL job: trainer and inference in two worlds, the site's ledger in charge.

    pip install -e .                                   # from a fresh clone
    python examples/refit_loop.py --site local --steps 5 --sleep-s 1 [--events-dir runs/loop]

Four processes on this machine, gloo on the CPU: 2 trainer ranks (tensor parallel 2, megatron-core
parameter names) with their own default world, 2 inference ranks (tensor parallel 2, vLLM's fused
parameter names) with theirs, as an RL framework runs them. After each "training step" the new weights
go from the trainer's parameters straight into the inference ranks' parameters through reshardctl's
update group; the transport is whatever the site's ledger says at that refit, so a
``reshardctl rollback --site SITE`` in another shell switches the next refit to gather-and-broadcast
and ``reshardctl promote`` switches it back, without a restart. After every refit each inference rank
compares every parameter, bit for bit, with a reference computed from the full weights
(examples/stand_in_models.py, independent of reshardctl's layout code). One JSON line per refit on
stdout; exit status 1 if any refit was not verified. Glue a framework writes: the lines marked GLUE.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time

import queue

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reshardctl import api
from reshardctl.launch.ports import free_port  # a port below the ephemeral range (your launcher has its own)
from stand_in_models import MegatronGPT, VllmLlama, reference_weights

TP = 2


def trainer(rank: int, args, token: str, ports: dict, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports['train']}", rank=rank, world_size=TP)
    plan = api.plan_refit(model=args.model, train=f"tp={TP}", infer=f"tp={TP}", site=args.site)  # GLUE
    model = MegatronGPT(plan.model.config, TP, rank)  # stands in for megatron-core's GPTModel on this rank
    refitter = api.Refitter(  # GLUE
        plan, site=args.site, binding=api.bind(plan, "train", rank, model.module), events_dir=args.events_dir,  # GLUE
        update_group=api.UpdateGroup(f"127.0.0.1:{ports['update']}", token, "train", rank))  # GLUE
    for step in range(1, args.steps + 1):
        model.train_step(reference_weights(plan.model.config, step))  # stands in for an optimizer step
        try:
            refitter.refit(step)  # GLUE
        except api.ReshardError as exc:  # the inference ranks report it; the trainer goes on training
            print(f"trainer rank {rank}: refit of step {step} failed: {exc}", file=sys.stderr)
        time.sleep(args.sleep_s)
    refitter.close()
    dist.destroy_process_group()


def inference(rank: int, args, token: str, ports: dict, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports['infer']}", rank=rank, world_size=TP)
    plan = api.plan_refit(model=args.model, train=f"tp={TP}", infer=f"tp={TP}", site=args.site)  # GLUE
    engine = VllmLlama(plan.model.config, TP, rank)  # stands in for vLLM's model runner on this rank
    refitter = api.Refitter(  # GLUE
        plan, site=args.site, binding=api.bind(plan, "infer", rank, engine.module), events_dir=args.events_dir,  # GLUE
        update_group=api.UpdateGroup(f"127.0.0.1:{ports['update']}", token, "infer", rank))  # GLUE
    failed = 0
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        line = {"step": step}
        try:
            report = refitter.refit(step)  # GLUE
            line.update(transport=report.transport, ledger_entry=report.ledger_entry)
        except api.ReshardError as exc:
            line.update(transport=None, ledger_entry=None, error=str(exc).splitlines()[0])
        line["refit_s"] = round(time.perf_counter() - start, 4)
        differ = engine.matches(reference_weights(plan.model.config, step))
        bad = torch.tensor([len(differ)])
        dist.all_reduce(bad)  # the inference world's own group: untouched by the refits
        line["verified"] = "error" not in line and int(bad.item()) == 0
        if differ:
            line["differ"] = differ[:3]
        failed += not line["verified"]
        if rank == 0:
            out.put(json.dumps(line))
    refitter.close()
    dist.destroy_process_group()
    if rank == 0:
        out.put(None)
    sys.exit(1 if failed else 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", default="local", help="site profile (name or file): its ledger decides the transport")
    ap.add_argument("--model", default="tiny-llama", help="a dense Llama-style model of the catalog")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--sleep-s", type=float, default=0.0, help="pause between steps (time to run a rollback)")
    ap.add_argument("--events-dir", default=None,
                    help="keep every rank's refit events here (events/rank-N.jsonl: `reshardctl report` and "
                         "`reshardctl trace` read it)")
    args = ap.parse_args()
    ports = {"train": free_port(), "infer": free_port(), "update": free_port()}
    token = secrets.token_hex(16)  # GLUE: the job's secret; a process without it cannot join the update group
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(r, args, token, ports, out)) for fn in (trainer, inference) for r in range(TP)]
    for p in procs:
        p.start()
    while True:
        try:
            line = out.get(timeout=1.0)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):  # a rank died: the others may wait on it
                break
            continue
        if line is None:
            break
        print(line, flush=True)
    for p in procs:
        p.join(timeout=None if all(q.exitcode in (None, 0) for q in procs) else 30)
        if p.is_alive():
            p.terminate()
            p.join()
    codes = [p.exitcode for p in procs]
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
