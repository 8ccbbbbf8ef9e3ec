#!/usr/bin/env bash
# The first GPU hour (issue 37): what ONE lent GPU can prove, in one script, in under 8 minutes.
#
#   bash benchmarks/gpu_one_device.sh OUT_DIR [--cpu-dry]      # from anywhere; OUT_DIR is created
#
# OUT_DIR receives STEP.json for every step ({step, status, ok, seconds, why, device, torch, detail}),
# STEP.log, summary.json and the pass/fail table (printed too). Every step runs under `timeout`; the
# limits below (and the interpreter checks) add up to less than 8 minutes; a failed step does not stop
# the next one. Steps: install, selftest, checksums, rates, staging, gloo_refit, nccl_abort, calibrate
# (benchmarks/one_device.py and docs/gpu.md, "What one GPU proves").
#
# Interpreter: $PYTHON, else the first of python3 and .venv/bin/python whose torch sees CUDA, else the
# first with torch. Nothing is downloaded and torch is never installed: the package runs from this tree
# (PYTHONPATH); a missing pure-Python dependency comes from a local wheel directory RESHARDCTL_WHEELS, if
# given (`make wheels`), into OUT_DIR/pydeps (pip --target, on PYTHONPATH after the tree: torch untouched).
# No CUDA, or --cpu-dry: the CPU-possible steps run on the CPU, the GPU-only ones (staging, nccl_abort,
# calibrate) are "skipped" with the reason and a CPU rehearsal of their code.
# ONE_DEVICE_STEPS="checksums rates" runs only those (a rerun); ONE_DEVICE_LIMITS="step:seconds ..." replaces
# the limits (the tests). Exit 1 if any step failed, 2 on bad usage.
set -u -o pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=""
MODE=""
for arg in "$@"; do
    case "$arg" in
        --cpu-dry) MODE="--cpu" ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        -*) echo "gpu_one_device: unknown option $arg" >&2; exit 2 ;;
        *) [ -z "$OUT" ] && OUT=$arg || { echo "gpu_one_device: one OUT_DIR only" >&2; exit 2; } ;;
    esac
done
[ -n "$OUT" ] || { echo "usage: gpu_one_device.sh OUT_DIR [--cpu-dry]" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 2

# step -> its limit in seconds (with the 3 s kill grace each, the two interpreter checks, the wheel install
# and the C row sums' build: 30+45+40+40+30+70+55+25 + 8x3 + 2x20 + 45 + 30 = 474 s < 480 s)
STEP_LIMITS=${ONE_DEVICE_LIMITS:-"install:30 selftest:45 checksums:40 rates:40 staging:30 gloo_refit:70 nccl_abort:55 calibrate:25"}
STEPS=${ONE_DEVICE_STEPS:-install selftest checksums rates staging gloo_refit nccl_abort calibrate}

# ---- the interpreter (never installs torch) ----------------------------------------------------------
probe() {  # probe PY: 2 = torch with CUDA, 1 = torch without, 0 = no torch (bounded: a CUDA init can hang)
    timeout 20 "$1" -c 'import sys, torch; sys.exit(12 if torch.cuda.is_available() else 11)' >/dev/null 2>&1
    case $? in 12) return 2 ;; 11) return 1 ;; *) return 0 ;; esac
}
PY=""
HOW=""
KIND=0
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
    probe "$PY"
    KIND=$?
    HOW="PYTHON=$PYTHON"
else
    FALLBACK=""
    for cand in python3 "$ROOT/.venv/bin/python"; do
        command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
        probe "$cand"
        case $? in
            2) PY=$cand; KIND=2; HOW="$cand: its torch sees CUDA"; break ;;
            1) [ -n "$FALLBACK" ] || FALLBACK=$cand ;;
        esac
    done
    if [ -z "$PY" ]; then
        PY=${FALLBACK:-python3}
        if [ -n "$FALLBACK" ]; then KIND=1; HOW="$PY: torch without CUDA"; else HOW="$PY: no torch found"; fi
    fi
fi
[ "$KIND" -eq 2 ] || MODE="--cpu"

# missing pure-Python dependencies, from a local wheel directory only (offline), never torch
MISSING=$("$PY" -c 'import importlib.util as u; print(" ".join(p for m, p in (("numpy","numpy"),("typer","typer"),("rich","rich"),("yaml","pyyaml"),("safetensors","safetensors")) if u.find_spec(m) is None))' 2>/dev/null)
if [ -n "$MISSING" ] && [ -n "${RESHARDCTL_WHEELS:-}" ]; then
    echo "gpu_one_device: installing $MISSING from $RESHARDCTL_WHEELS into $OUT/pydeps (offline; torch untouched)"
    # shellcheck disable=SC2086 - one word per package name
    if timeout 45 "$PY" -m pip install -q --no-index --find-links "$RESHARDCTL_WHEELS" --target "$OUT/pydeps" \
            $MISSING > "$OUT/install-wheels.log" 2>&1; then
        export PYTHONPATH="$PYTHONPATH:$OUT/pydeps"
        export ONE_DEVICE_PYDEPS="$OUT/pydeps"
        HOW="$HOW; $MISSING from $RESHARDCTL_WHEELS"
    else
        HOW="$HOW; installing $MISSING from $RESHARDCTL_WHEELS failed (install-wheels.log)"
    fi
fi
# the checksum's optional compiled row sums (setup.py, docs/checksums.md), built in place where a compiler
# is; without them the CPU checksum takes torch's fastest path (both are compared with CUDA's)
if ! ls "$ROOT"/reshardctl/runtime/_rowsums*.so >/dev/null 2>&1; then
    if timeout 30 "$PY" setup.py -q build_ext --inplace > "$OUT/build-ext.log" 2>&1 \
            && ls "$ROOT"/reshardctl/runtime/_rowsums*.so >/dev/null 2>&1; then
        HOW="$HOW; the checksum's C row sums built in place"
    else
        HOW="$HOW; the checksum's C row sums not built (build-ext.log): torch's CPU paths"
    fi
fi
export ONE_DEVICE_HOW="$HOW"
echo "gpu_one_device: $HOW; mode ${MODE:-gpu}; results in $OUT"

# ---- the steps --------------------------------------------------------------------------------------
limit_of() {
    local pair
    for pair in $STEP_LIMITS; do
        [ "${pair%%:*}" = "$1" ] && { echo "${pair#*:}"; return 0; }
    done
    return 1
}

run_step() {  # run_step STEP: the step's process under `timeout`; a JSON for it whatever happens
    local step=$1 limit t0=$SECONDS rc secs why
    limit=$(limit_of "$step") || { echo "gpu_one_device: unknown step $step" >&2; return 2; }
    rm -f "$OUT/$step.json"
    timeout --kill-after=3 "$limit" "$PY" "$HERE/one_device.py" "$step" "$OUT" $MODE > "$OUT/$step.log" 2>&1
    rc=$?
    secs=$((SECONDS - t0))
    if [ ! -s "$OUT/$step.json" ]; then
        why="exit $rc after $secs s, no result (see $step.log)"
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="not done within its limit of $limit s (timeout)"; fi
        printf '{"step": "%s", "status": "fail", "ok": false, "seconds": %s, "why": "%s", "detail": {"exit": %s}}\n' \
            "$step" "$secs" "$why" "$rc" > "$OUT/$step.json"
        echo "FAIL $step ($secs s): $why"
    else
        tail -n 1 "$OUT/$step.log"
    fi
}

for step in $STEPS; do
    run_step "$step" || exit 2
done

# shellcheck disable=SC2086 - one word per step
timeout 30 "$PY" "$HERE/one_device.py" summary "$OUT" $STEPS
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then  # no Python to summarise with: the steps' own lines above
    echo "gpu_one_device: no summary (exit $rc); per-step results in $OUT/*.json"
    exit 1
fi
exit "$rc"
