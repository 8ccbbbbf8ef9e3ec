"""Probes of the NCCL path under the Python API, for benchmarks/gpu_node_check.sh: one process per GPU
under torchrun (``torchrun --nproc-per-node=N benchmarks/nccl_probe.py MODE``), a small Llama config.

* ``api-stall``: the framework's default group on NCCL (monitor safe: the script exports
  ``TORCH_NCCL_DUMP_ON_TIMEOUT=0`` and a short ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``); the last rank stalls
  mid-transfer in step 1 for 3 timeouts; every rank must see step 1 fail, be alive 2 heartbeat timeouts
  later with its default group usable (an all-reduce), and commit step 2 on rebuilt groups.
* ``memory``: device memory used outside torch's caching allocator (``mem_get_info``) before and after a
  Refitter is built and pre-connected: what NCCL's communicators, channels and p2p buffers take per GPU.

Each rank prints one JSON line; rank 0 prints ``PROBE PASS`` or ``PROBE FAIL`` after a gather on the
default group. Exit status 0 only on pass (every rank)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

SMALL_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1024,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
}
TIMEOUT_S = 5.0


def _plan(world: int):
    from reshardctl import api

    cfg = os.path.join(tempfile.mkdtemp(prefix="nccl-probe-"), "config.json")
    with open(cfg, "w") as fh:
        json.dump(SMALL_LLAMA, fh)
    half = world // 2
    return api.plan_refit(model=cfg, train=f"tp={half}", infer=f"tp={world - half}")


def _local(refitter, plan, step: int) -> dict:
    from reshardctl.runtime.synthetic_weights import synthetic_region

    by_name = {t.name: t for t in plan.model.tensors}
    return {n: [synthetic_region(by_name[n], b, step).cuda() for b in boxes]
            for n, boxes in refitter.holdings().items()}


def _refit(refitter, plan, rank: int, step: int, local) -> str:
    from reshardctl.errors import ReshardError

    try:
        if rank < plan.train_world:
            refitter.refit(step, local_src=local)
        else:
            refitter.refit(step, local_dst=local)
        return "committed"
    except ReshardError as exc:
        return type(exc).__name__


def api_stall(rank: int, world: int) -> dict:
    from reshardctl import api

    plan = _plan(world)
    refitter = api.Refitter(plan, timeout_s=TIMEOUT_S)
    if rank == world - 1:
        stalled = []

        def tap(at, buf, n):
            if at == 1 and not stalled:
                stalled.append(at)
                time.sleep(3 * TIMEOUT_S)
        refitter.executor.tap = tap
    local = _local(refitter, plan, 1)
    first = _refit(refitter, plan, rank, 1, local)
    time.sleep(2 * float(os.environ.get("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "480")))
    probe = torch.ones(1, device="cuda")
    dist.all_reduce(probe)
    second = _refit(refitter, plan, rank, 2, _local(refitter, plan, 2) if rank < plan.train_world else local)
    refitter.close()
    ok = first != "committed" and int(probe.item()) == world and second == "committed"
    return {"rank": rank, "step1": first, "default_group_sum": int(probe.item()), "step2": second, "ok": ok}


def memory(rank: int, world: int) -> dict:
    from reshardctl import api

    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info()
    alloc0 = torch.cuda.memory_reserved()
    plan = _plan(world)
    refitter = api.Refitter(plan, timeout_s=60.0)
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    alloc1 = torch.cuda.memory_reserved()
    outside = (free0 - free1) - (alloc1 - alloc0)
    refitter.close()
    return {"rank": rank, "nccl_and_context_mib": round(outside / 2**20, 1),
            "allocator_mib": round((alloc1 - alloc0) / 2**20, 1), "total_mib": round(total / 2**20), "ok": True}


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("api-stall", "memory"):
        print("usage: torchrun --nproc-per-node=N benchmarks/nccl_probe.py api-stall|memory", file=sys.stderr)
        return 2
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    out = api_stall(rank, world) if mode == "api-stall" else memory(rank, world)
    print(json.dumps(out), flush=True)
    flags = torch.tensor([1 if out["ok"] else 0], device="cuda")
    dist.all_reduce(flags)
    passed = int(flags.item()) == world
    if rank == 0:
        print("PROBE PASS" if passed else "PROBE FAIL", flush=True)
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
