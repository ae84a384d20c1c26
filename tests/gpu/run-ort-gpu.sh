#!/usr/bin/env bash
# GPU call 2: the frontends scaling run, then onnxruntime-gpu brought in parts and the CUDA
# provider's paths (docs/development.md, "The GPU plan"). The same command serves every
# transfer of the call; each does what its carried files allow:
#
#   tests/gpu/run-ort-gpu.sh [RESULTS_DIR]     (default: $OUT where set, else build/gpu-run)
#
# 1. Exits 2 at once, saying why, where no NVIDIA GPU is visible.
# 2. The wheels of `make gpu-wheels` (build/gpu-wheels), unless an earlier call installed
#    them on this machine.
# 3. frontends-scaling (once per machine, at most 120 s): benchmarks/frontends_bench.py
#    --scaling with 1, 4 and 8 frontends (frontends.json).
# 4. ort-gpu-parts: tests/gpu/ort-gpu-install.sh keeps the carried parts of the repacked
#    onnxruntime-gpu (build/ort-gpu-parts, `make gpu-ort-pack`) outside the work tree; while
#    some are missing the call ends here with exit 3, naming them. With the last one it
#    unpacks them and runs a model on the bare CUDA provider (ort_gpu_check.py).
# 5. ort-session: tensord's own loading opens a model on the CUDA provider (the CUDA and
#    cuDNN libraries from the host's nvidia-* wheels) and the provider is read back; the
#    tests marked ort_gpu (TF32 off); Predict through the daemon on the CUDA provider
#    (kernel_bench.py --predict-only: GPU against CPU preprocessing, kernels.json).
# 6. Where build/gpu-models is carried (`make gpu-models`: the fp16 CUDA builder folder of
#    the Generate benchmark's Llama and its Optimum export in float32 and float16, 27 MiB,
#    which does not fit beside both parts, so call 3 carries it on its own): slots,
#    tests/gpu/test_slots_gpu.py (tensord's loader serves the folder, and the float16
#    export rewritten, on KV slots in device memory; streams against each alone and
#    transformers; prefixes through page-locked memory; a decode pass moves no KV bytes),
#    and generate-bench,
#    benchmarks/gpu_generate_bench.py (tokens/s at 1, 16 and 64 streams,
#    gpu-generate.json). Not carried, both are left to call 3, saying so; named in
#    TENSORD_GPU_STEPS without it, the call fails.
# 7. summary.json and the one-screen summary; exit 0 only when every step passed.
#
# Environment: PYTHON, TENSORD_GPU_WHEELS, TENSORD_GPU_SITE, TENSORD_ORT_GPU_DIR
# (/var/tmp/tensord-ort-gpu), TENSORD_GPU_CALL_SECONDS (450), TENSORD_GPU_STEPS,
# TENSORD_GPU_TESTS (tests/gpu/steps.sh).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
# shellcheck source=tests/gpu/steps.sh
source tests/gpu/steps.sh
ORT_DIR=${TENSORD_ORT_GPU_DIR:-/var/tmp/tensord-ort-gpu}
open_results run-ort-gpu "${1:-}"
rm -f "$RESULTS"/{device.json,gpu-tests.xml,kernels.json,frontends*,gpu-generate.json}

# The caps add up to 430 s (gpu-visible 10 and wheels 30 included), under the call's 450.
# A transfer run under a shorter timeout_s sets TENSORD_GPU_CALL_SECONDS to it less 30 s:
# no step then starts or runs past it, and the summary is still written. The slots and
# generate-bench steps (90 + 60 s) run only where build/gpu-models is carried: call 3,
# TENSORD_GPU_STEPS=slots,generate-bench with TENSORD_GPU_CALL_SECONDS=180 (10 + 90 + 60).
CAP_SCALING=120 CAP_PARTS=60 CAP_SESSION=30 CAP_TESTS=120 CAP_PREDICT=60
CAP_SLOTS=90 CAP_GENERATE=60
GPU_MODEL=build/gpu-models/llama-fp16-cuda
DEADLINE=$((STARTED + ${TENSORD_GPU_CALL_SECONDS:-450}))

gpu_or_stop
use_wheels
export PYTHONPATH="$PATHS$REPO/daemon:$REPO/clients/python:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if want frontends-scaling && [ ! -e "$ORT_DIR/.scaling-done" ]; then
    mkdir -p "$ORT_DIR"
    nproc
    step frontends-scaling "$CAP_SCALING" "1, 4 and 8 frontends" \
        "$PY" benchmarks/frontends_bench.py --scaling --quick --duration 1 --warmup 0.5 \
        --frontends 1,4,8 --results-dir "$RESULTS" && touch "$ORT_DIR/.scaling-done"
fi

if want ort-gpu-parts || [ ! -d "$ORT_DIR/site/onnxruntime" ]; then
    TENSORD_ORT_GPU_DIR=$ORT_DIR step ort-gpu-parts "$CAP_PARTS" "" \
        bash tests/gpu/ort-gpu-install.sh build/ort-gpu-parts
    case $? in
        0) ;;
        3) echo "run-ort-gpu: carry the missing parts next (with build/ort-gpu-parts/SHA256SUMS)"
           finish 3 ;;
        *) echo "run-ort-gpu: onnxruntime-gpu did not install (run.log says why)" >&2
           finish 1 ;;
    esac
fi
export PYTHONPATH="$ORT_DIR/site:$PYTHONPATH"

if want ort-session; then
    step ort-session "$CAP_SESSION" "" "$PY" tests/gpu/facts.py --cuda-session ||
        { echo "run-ort-gpu: no CUDA-provider session (run.log says why)" >&2; finish 1; }
    "$PY" tests/gpu/facts.py "$RESULTS/device.json" >/dev/null
fi
if want gpu-tests; then
    # test_slots_gpu.py needs build/gpu-models: the slots step runs it.
    TESTS=(tests/gpu --ignore=tests/gpu/test_slots_gpu.py -m ort_gpu)
    # shellcheck disable=SC2206  # split on purpose: node ids, or -k with one word
    [ -n "${TENSORD_GPU_TESTS:-}" ] && TESTS=($TENSORD_GPU_TESTS -m ort_gpu)
    step gpu-tests "$CAP_TESTS" "the ort_gpu tests" \
        env TENSORD_REQUIRE_GPU=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
        "$PY" -m pytest -p pytest_asyncio.plugin -p pytest_timeout -p no:cacheprovider \
        -rfEs --junitxml="$RESULTS/gpu-tests.xml" "${TESTS[@]}"
fi
if want predict; then
    step predict "$CAP_PREDICT" "GPU against CPU preprocessing, CUDA provider" \
        "$PY" benchmarks/kernel_bench.py --predict-only --requests 50 \
        --out "$RESULTS/kernels.json"
fi
if [ -f "$GPU_MODEL/genai_config.json" ]; then
    if want slots; then
        step slots "$CAP_SLOTS" "fp16 builder folder on device KV slots" \
            env TENSORD_REQUIRE_GPU=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
            "$PY" -m pytest -p pytest_asyncio.plugin -p pytest_timeout -p no:cacheprovider \
            -rfEsP tests/gpu/test_slots_gpu.py
    fi
    if want generate-bench; then
        step generate-bench "$CAP_GENERATE" "tensord's slot engine at 1, 16, 64 streams" \
            "$PY" benchmarks/gpu_generate_bench.py --model "$GPU_MODEL" \
            --out "$RESULTS/gpu-generate.json"
    fi
elif [ -n "${TENSORD_GPU_STEPS:-}" ] && { want slots || want generate-bench; }; then
    printf 'gpu-models\t3\t0\t%s not carried (make gpu-models)\n' "$GPU_MODEL" \
        >>"$RESULTS/steps.tsv"
    echo "run-ort-gpu: carry build/gpu-models (make gpu-models) for slots, generate-bench" >&2
else
    echo "run-ort-gpu: build/gpu-models not carried: slots and generate-bench are call 3's"
fi
finish
