#!/usr/bin/env bash
# One 8-GPU node, about 10 minutes: the NCCL path after a failure (issue 27, docs/gpu.md).
#
#   bash benchmarks/gpu_node_check.sh            # from the repository root; PYTHON=... to pick the interpreter
#
# Every step is bounded by `timeout` and prints "PASS <step>", "FAIL <step>" or "SKIP <step>" (steps that
# need NCCL skip on a machine without CUDA, where the CPU-possible steps run on gloo with 4 ranks). The
# logs of every step stay in $OUT (default: a fresh temporary directory). Exit status 1 if any step failed.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d -t gpu-node-check-XXXXXX)}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_NCCL_DUMP_ON_TIMEOUT=0   # the framework's side of the contract (docs/gpu.md, "Torch's monitor")
cd "$ROOT" || exit 2

GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "$GPUS" -ge 2 ]; then
    export RESHARDCTL_BACKEND=nccl
    HALF=$((GPUS / 2))
else
    export RESHARDCTL_BACKEND=gloo RESHARDCTL_FORCE_CPU=1
    HALF=2
fi
# the inference side in another layout than the trainers' (tp halves replicated twice): a real reshard, not
# a one-to-one copy between identical layouts; an odd half (3, 5, 7 ranks) keeps tp=HALF
if [ $((HALF % 2)) -eq 0 ]; then INFER="tp=$((HALF / 2)),dp=2"; else INFER="tp=$HALF"; fi
echo "gpu_node_check: $GPUS GPU(s), backend $RESHARDCTL_BACKEND, tp=$HALF -> $INFER ($HALF + $HALF ranks), logs in $OUT"

MODEL="$OUT/model/config.json"
mkdir -p "$OUT/model"
cat > "$MODEL" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
 "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1024,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}
JSON

FAILED=0
pass() { echo "PASS $1${2:+ ($2)}"; }
fail() { echo "FAIL $1${2:+ ($2)} - log: $OUT/$1.log"; FAILED=1; }
skip() { echo "SKIP $1 ($2)"; }

# run STEP LIMIT_S CMD...: the command under `timeout`, its output in $OUT/STEP.log; sets RC and SECS
run() {
    local step=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$step.log" 2>&1
    RC=$?
    SECS=$((SECONDS - t0))
}

refit() {  # refit STEP LIMIT_S [reshardctl run options...]
    local step=$1 limit=$2
    shift 2
    run "$step" "$limit" "$PY" -m reshardctl run --model "$MODEL" --train "tp=$HALF" --infer "$INFER" \
        --out "$OUT/$step" --force "$@"
}

# 1. selftest: pack, checksums, stream order, pinned pool, an NCCL refit (--gpu); CPU: the same on the CPU
if [ "$GPUS" -ge 1 ]; then
    run selftest 60 "$PY" -m reshardctl selftest --gpu
else
    run selftest 60 "$PY" -m reshardctl selftest
fi
[ "$RC" -eq 0 ] && pass selftest "${SECS}s" || fail selftest "exit $RC after ${SECS}s"

# 2. reshard with relay (two-stage fan-out), byte-compared
refit reshard_relay 75 --transport reshard --relay on --iters 2 --full-check --timeout-s 30
[ "$RC" -eq 0 ] && pass reshard_relay "${SECS}s" || fail reshard_relay "exit $RC after ${SECS}s"

# 3. gather-and-broadcast over sub-communicators (the buckets' groups), one communicator at a time
refit gather_broadcast 75 --transport gather_broadcast --iters 2 --full-check --timeout-s 30
[ "$RC" -eq 0 ] && pass gather_broadcast "${SECS}s" || fail gather_broadcast "exit $RC after ${SECS}s"

# 4. a hang at step 2 (connections exist) with --retries 1: the silent rank is lost (no retry: settling
#    does not wait for it again, docs/runbook-faults.md), the NCCL groups are aborted, every other rank
#    reports with its own error (none killed by torch's monitor: none lost) and the run ends within the bound
refit hang_step2_retry 120 --iters 3 --timeout-s 10 --retries 1 --inject "hang:rank=1:phase=transfer:step=2:seconds=30"
if [ "$RC" -eq 1 ] && [ "$SECS" -lt 60 ] && grep -q "root cause: rank 1 " "$OUT/hang_step2_retry.log" \
        && grep "other ranks stopped because of it" "$OUT/hang_step2_retry.log" | grep -vq RankLost; then
    pass hang_step2_retry "failed as it must, in ${SECS}s"
else
    fail hang_step2_retry "exit $RC after ${SECS}s (want 1, bounded, no survivor lost)"
fi

# 4b. a retry on rebuilt groups: a byte corrupted at step 2 where the first inference rank (rank $HALF) landed
#     it fails verification on every rank (all alive; a trainer receives nothing to corrupt),
#     every rank settles, the groups are released and rebuilt (exception_dump deleted), and step 2 commits
refit corrupt_step2_retry 120 --iters 3 --timeout-s 10 --retries 1 --inject "corrupt:rank=$HALF:step=2"
if [ "$RC" -eq 0 ] && grep -q "step 2 attempt 1 (reshard): committed" "$OUT/corrupt_step2_retry.log"; then
    pass corrupt_step2_retry "${SECS}s"
else
    fail corrupt_step2_retry "exit $RC after ${SECS}s"
fi

# 5. a hang at first contact (phase connect, step 1: no connection exists yet): the run fails on every
#    other rank within the timeout (the bounded pre-connect), not at the walltime
refit hang_step1_connect 75 --iters 2 --timeout-s 10 --inject "hang:rank=1:phase=connect:step=1"
if [ "$RC" -eq 1 ] && [ "$SECS" -lt 60 ] && grep -q "phase connect, step 1" "$OUT/hang_step1_connect.log" \
        && grep -q "TransferError in connect" "$OUT/hang_step1_connect.log"; then
    pass hang_step1_connect "failed as it must, in ${SECS}s"
else
    fail hang_step1_connect "exit $RC after ${SECS}s (want 1, bounded)"
fi

# 6. the API under torchrun: a rank stalls mid-transfer; every rank alive and its default group usable
#    after twice a short heartbeat timeout; the next refit commits
if [ "$GPUS" -ge 2 ]; then
    TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=10 run api_stall 120 "$PY" -m torch.distributed.run --standalone \
        --nproc-per-node="$GPUS" benchmarks/nccl_probe.py api-stall
    [ "$RC" -eq 0 ] && grep -q "PROBE PASS" "$OUT/api_stall.log" && pass api_stall "${SECS}s" \
        || fail api_stall "exit $RC after ${SECS}s"
else
    skip api_stall "needs 2+ GPUs: NCCL default group under torchrun"
fi

# 7. NCCL memory per GPU (outside the caching allocator) after a Refitter is built and pre-connected
if [ "$GPUS" -ge 2 ]; then
    run nccl_memory 60 "$PY" -m torch.distributed.run --standalone --nproc-per-node="$GPUS" \
        benchmarks/nccl_probe.py memory
    if [ "$RC" -eq 0 ] && grep -q "PROBE PASS" "$OUT/nccl_memory.log"; then
        pass nccl_memory "$(grep -o '"nccl_and_context_mib": [0-9.]*' "$OUT/nccl_memory.log" | awk '{print $2}' | sort -n | tail -1) MiB max per GPU"
    else
        fail nccl_memory "exit $RC after ${SECS}s"
    fi
else
    skip nccl_memory "needs 2+ GPUs"
fi

echo "gpu_node_check: $([ "$FAILED" -eq 0 ] && echo "all steps passed or skipped" || echo "FAILED"); logs in $OUT"
exit "$FAILED"
