#!/usr/bin/env bash
# GPU call 1: every GPU path of tensord that needs no onnxruntime-gpu, on a GPU host with no
# network, in at most 330 s (docs/development.md, "The GPU plan").
#
#   tests/gpu/run-offline.sh [RESULTS_DIR]     (default: $OUT where set, else build/gpu-run)
#
# 1. Exits 2 at once, saying why, where no NVIDIA GPU is visible.
# 2. Installs the wheels of `make gpu-wheels` (carried as build/gpu-wheels: the packages the
#    host lacks, and the pinned CPU onnxruntime) with --no-index into $TENSORD_GPU_SITE.
# 3. device.json: nvidia-smi, driver, CUDA, NVRTC, ONNX Runtime, TensorRT, package versions.
# 4. The GPU tests with TENSORD_REQUIRE_GPU=1 (a skip fails), JUnit in gpu-tests.xml: the
#    kernels against their NumPy twins; the executor's lanes, pools, overlap and
#    out-of-memory; the sticky errors (an illegal address on the device; 999's class);
#    the daemon's GPU pre- and postprocessing over a CPU model behind device buffers. The
#    tests marked ort_gpu are call 2's (tests/gpu/run-ort-gpu.sh).
# 5. benchmarks/kernel_bench.py (kernels.json) and benchmarks/gpu_bench.py (gpu.json).
# 6. summary.json and a one-screen summary. Exit 0 only when every step passed and no GPU
#    test failed or was skipped; speed targets are reported, not enforced.
# At most 7 files in RESULTS_DIR (8 come back from a call).
#
# Environment: PYTHON (python3), TENSORD_GPU_WHEELS (build/gpu-wheels), TENSORD_GPU_SITE
# (/tmp/tensord-gpu-site), TENSORD_GPU_STEPS and TENSORD_GPU_TESTS (rerun one step or one
# test: tests/gpu/steps.sh).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
# shellcheck source=tests/gpu/steps.sh
source tests/gpu/steps.sh
open_results run-offline "${1:-}"
rm -f "$RESULTS"/{device.json,gpu-tests.xml,kernels.json,gpu.json}

# The caps: the steps' seconds add up to CALL1_SECONDS, which the docs' timeout_s allows.
CAP_VISIBLE=10 CAP_WHEELS=30 CAP_IMPORTS=15 CAP_FACTS=20 CAP_TESTS=150 CAP_KERNELS=60 CAP_GPU=45
CALL1_SECONDS=330
DEADLINE=$((STARTED + CALL1_SECONDS))

gpu_or_stop
use_wheels
export PYTHONPATH="$PATHS$REPO/daemon:$REPO/clients/python:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
step imports "$CAP_IMPORTS" "" "$PY" tests/gpu/facts.py --imports ||
    { echo "run-offline: packages are missing (make gpu-wheels, and carry build/gpu-wheels)" >&2; finish 2; }
step facts "$CAP_FACTS" "" "$PY" tests/gpu/facts.py "$RESULTS/device.json" ||
    { echo "run-offline: the CUDA probe sees no device (device.json says why)" >&2; finish 2; }

if want gpu-tests; then
    TESTS=(tests/gpu tests/unit/cuda/test_device_fault.py -m "not ort_gpu")
    # shellcheck disable=SC2206  # split on purpose: node ids, or -k with one word
    [ -n "${TENSORD_GPU_TESTS:-}" ] && TESTS=($TENSORD_GPU_TESTS -m "not ort_gpu")
    step gpu-tests "$CAP_TESTS" "the ort_gpu tests are call 2's" \
        env TENSORD_REQUIRE_GPU=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
        "$PY" -m pytest -p pytest_asyncio.plugin -p pytest_timeout -p no:cacheprovider \
        -rfEs --junitxml="$RESULTS/gpu-tests.xml" "${TESTS[@]}"
fi
if want kernel-bench; then
    step kernel-bench "$CAP_KERNELS" "" "$PY" benchmarks/kernel_bench.py --skip-predict \
        --reps 20 --out "$RESULTS/kernels.json"
fi
if want gpu-bench; then
    step gpu-bench "$CAP_GPU" "" "$PY" benchmarks/gpu_bench.py --reps 10 --batches 32 \
        --out "$RESULTS/gpu.json"
fi
finish
