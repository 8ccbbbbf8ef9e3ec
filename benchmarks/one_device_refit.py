"""Step gloo_refit of benchmarks/gpu_one_device.sh: a real refit whose ranks all live on the one GPU.

Two trainer and two inference ranks (tp=2 -> tp=1,dp=2), started by the local launcher with
``RunOptions.device = "cuda-gloo"``: every rank's weights, arena, staging blocks and checksums on
``cuda:0``, the executor's CUDA path (side stream, stream waits, release events, device spans), the
verify phase's checksums and the two-phase commit for real; the bytes move between the processes
through gloo and pinned host buffers (runtime/host_staging.py), because NCCL refuses two ranks of one
communicator on one device. One session of two plans on the same processes: reshard (rounds, staged
and in-place messages) then gather-and-broadcast (buckets over broadcast sub-groups); ``--full-check``
compares every destination box with the weight source before the commit; a corrupted byte at step 2
must fail verification on every rank, and the retry on rebuilt groups must commit.

Without CUDA the same session runs on the CPU (plain gloo, a smaller model): the launcher, the plans
and this step's checks, not the GPU.
"""

from __future__ import annotations

import json

from one_device import Fail, injected

SMALL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
         "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1024,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}
TRAIN, INFER = "tp=2", "tp=1,dp=2"
ITERS = 2  # per plan: reshard steps 1-2, gather_broadcast steps 3-4


def _plans(model: str) -> dict:
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare
    from reshardctl.runs.session import plan_transports

    return plan_transports(prepare(RefitRequest(model=model, train=TRAIN, infer=INFER)), ["reshard", "gather_broadcast"])


def step_gloo_refit(ctx) -> dict:
    from reshardctl.launch.local import launch_local_ranks
    from reshardctl.runtime.contract import RunOptions

    out, cpu = ctx["out"], ctx["cpu"]
    if cpu:
        cfg = out / "gloo_refit_model" / "config.json"
        cfg.parent.mkdir(exist_ok=True)
        cfg.write_text(json.dumps(SMALL))
        model = str(cfg)
    else:
        model = "tiny-llama"
    plans = _plans(model)
    first = plans["reshard"]
    corrupt_rank = first.train_world  # the first inference rank: a byte it received is flipped at step 2
    run_dir = out / "gloo_refit_run"
    run_dir.mkdir(exist_ok=True)
    options = RunOptions(run_dir=str(run_dir), iterations=ITERS, device="cpu" if cpu else "cuda-gloo", full_check=True,
                         timeout_s=30.0, retries=1, faults=f"corrupt:rank={corrupt_rank}:step=2")
    session = launch_local_ranks(plans, options, warmup=0)
    last = 2 * ITERS
    bad, ranks = [], []
    for name, reports in session.items():
        for r in reports:
            ranks.append({"plan": name, "rank": r.global_rank, "side": r.side, "ok": r.ok, "backend": r.backend,
                          "device": r.device, "committed_step": r.committed_step, "attempts": list(r.attempts),
                          "iterations": len(r.iterations), "peak_staging_bytes": r.peak_staging_bytes})
            want_device = "cpu" if cpu else "cuda"
            if not r.ok:
                bad.append(f"{name} rank {r.global_rank}: {r.error_type}: {r.error_message}")
            if r.backend != "gloo" or not r.device.startswith(want_device):
                bad.append(f"{name} rank {r.global_rank}: backend {r.backend!r} on {r.device!r}, want gloo on {want_device}")
            if len(r.iterations) != ITERS or not all(it.committed for it in r.iterations):
                bad.append(f"{name} rank {r.global_rank}: {len(r.iterations)} iterations, not all committed")
    for r in session["reshard"]:
        tried = [(a["step"], a["attempt"]) for a in r.attempts]
        failed_first = bool(r.attempts) and r.attempts[0]["outcome"] != "committed"
        if tried != [(2, 0), (2, 1)] or not failed_first:
            bad.append(f"reshard rank {r.global_rank}: attempts {r.attempts} (want step 2 failed at attempt 0, "
                       f"committed at attempt 1: the corrupted byte caught, the retry on rebuilt groups)")
    for r in session["gather_broadcast"]:
        if r.side == "infer" and r.committed_step != last:
            bad.append(f"gather_broadcast rank {r.global_rank}: ends on step {r.committed_step}, want {last}")
    if injected("gloo_refit"):
        bad.append("injected (ONE_DEVICE_INJECT=gloo_refit): the checks above are not trusted")
    outcome = session["reshard"][corrupt_rank].attempts[0]["outcome"] if session["reshard"][corrupt_rank].attempts else ""
    detail = {"model": model, "train": TRAIN, "infer": INFER, "device": options.device, "plans": list(session),
              "fault": options.faults, "corrupt_outcome": outcome[:300], "ranks": ranks, "run_dir": str(run_dir),
              "headline": f"{first.train_world}+{first.infer_world} ranks on "
                          f"{'the CPU' if cpu else 'cuda:0'} over gloo{'' if cpu else ' (host-staged)'}: reshard "
                          f"and gather_broadcast committed steps 1-{last} with --full-check; the corrupted byte at "
                          "step 2 failed verification, the retry committed"}
    if bad:
        raise Fail("; ".join(bad[:4]), detail | {"problems": bad[:40]})
    return detail
