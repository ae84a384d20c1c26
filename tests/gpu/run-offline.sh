#!/usr/bin/env bash
# Every GPU path of tensord on one GPU host with no network, in under 10 minutes.
#
#   tests/gpu/run-offline.sh [RESULTS_DIR]     (default: $OUT where set, else build/gpu-run)
#
# 1. Fails at once, saying why, where no NVIDIA GPU is visible.
# 2. Installs the wheels of `make gpu-wheels` (build/gpu-wheels, or $TENSORD_GPU_WHEELS)
#    with --no-index into a folder outside the work tree; onnxruntime-gpu too when
#    tests/gpu/ort-gpu-install.sh has put it in /var/tmp/tensord-ort-gpu/site.
# 3. device.json: nvidia-smi, driver, CUDA, NVRTC, ONNX Runtime, TensorRT, package versions.
# 4. Every GPU test with TENSORD_REQUIRE_GPU=1 (a skip fails), JUnit in gpu-tests.xml.
#    Without onnxruntime-gpu the tests marked ort_gpu are deselected, and the run says so.
# 5. benchmarks/kernel_bench.py (kernels.json; Predict on the CUDA provider where
#    onnxruntime-gpu is present) and benchmarks/gpu_bench.py (gpu.json).
# 6. summary.json and a one-screen summary. Exit 0 only when every step passed and no GPU
#    test failed or was skipped; speed targets are reported, not enforced.
#
# Environment: PYTHON (python3), TENSORD_GPU_WHEELS, TENSORD_GPU_SITE
# (/tmp/tensord-gpu-site), TENSORD_ORT_GPU_SITE (/var/tmp/tensord-ort-gpu/site),
# TENSORD_GPU_RUN_SECONDS (570: no step starts or runs past it; the summary always runs).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
RESULTS=${1:-${OUT:-build/gpu-run}}
mkdir -p "$RESULTS" || exit 2
RESULTS=$(cd "$RESULTS" && pwd)
rm -f "$RESULTS"/{steps.tsv,device.json,gpu-tests.xml,kernels.json,gpu.json,summary.json,run.log}
exec > >(tee -a "$RESULTS/run.log") 2>&1
TEE=$!

PY=${PYTHON:-python3}
WHEELS=${TENSORD_GPU_WHEELS:-build/gpu-wheels}
SITE=${TENSORD_GPU_SITE:-/tmp/tensord-gpu-site}
ORT_SITE=${TENSORD_ORT_GPU_SITE:-/var/tmp/tensord-ort-gpu/site}
STARTED=$(date +%s)
DEADLINE=$((STARTED + ${TENSORD_GPU_RUN_SECONDS:-570}))  # the summary must still run

# step NAME TIMEOUT_S NOTE COMMAND...: run it, record "name rc seconds note" in steps.tsv.
# No step runs past DEADLINE: one that would start with under 10 s left is not run.
step() {
    local name=$1 limit=$2 note=$3 start rc ms left
    shift 3
    left=$((DEADLINE - $(date +%s) - 5))
    if [ "$left" -lt 10 ]; then
        printf '%s\t125\t0\tnot run: the run'"'"'s time was spent\n' "$name" >>"$RESULTS/steps.tsv"
        return 125
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "--- $name ($(($(date +%s) - STARTED)) s into the run)"
    start=$(date +%s%N)
    timeout --kill-after=5 "$limit" "$@"
    rc=$?
    case $rc in 124 | 137) note="${note:+$note; }stopped after ${limit} s" ;; esac
    ms=$((($(date +%s%N) - start) / 1000000))
    printf '%s\t%s\t%d.%03d\t%s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) "$note" \
        >>"$RESULTS/steps.tsv"
    return "$rc"
}

finish() {
    "$PY" tests/gpu/summary.py "$RESULTS"
    local rc=${1:-$?}
    exec >&- 2>&-  # let tee write the last lines before the run ends
    wait "$TEE" 2>/dev/null
    exit "$rc"
}

# 1. A GPU, or a loud stop.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    printf 'gpu-visible\t2\t0\tnvidia-smi is not on the PATH: no NVIDIA driver on this host\n' \
        >>"$RESULTS/steps.tsv"
    echo "run-offline: no NVIDIA GPU here: nvidia-smi is not on the PATH (no NVIDIA driver)." >&2
    echo "run-offline: run this on the GPU host; nothing was measured." >&2
    finish 2
fi
if ! step gpu-visible 60 "" bash -c 'nvidia-smi -L | grep -q "^GPU "'; then
    echo "run-offline: nvidia-smi lists no GPU:" >&2
    nvidia-smi -L >&2
    finish 2
fi
nvidia-smi -L

# 2. Packages: the wheel bundle, and onnxruntime-gpu where it was installed beside.
step python 30 "" "$PY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' ||
    { echo "run-offline: $PY is older than Python 3.11" >&2; finish 2; }
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    if "$PY" -m pip --version >/dev/null 2>&1; then
        INSTALL=("$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps
            --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl)
    else  # an environment without pip: a wheel is a zip of what goes on the path
        INSTALL=("$PY" -c 'import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])' "$SITE" "$WHEELS"/*.whl)
    fi
    rm -rf "$SITE"
    step wheels 180 "$(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS" "${INSTALL[@]}" ||
        { echo "run-offline: the wheels in $WHEELS did not install" >&2; finish 2; }
    PATHS="$SITE:"
else
    echo "run-offline: no wheels in $WHEELS (make gpu-wheels where there is network):" \
        "using the host's packages"
    PATHS=""
fi
if [ -d "$ORT_SITE/onnxruntime" ]; then
    PATHS="$ORT_SITE:$PATHS"
    echo "onnxruntime-gpu from $ORT_SITE"
fi
export PYTHONPATH="$PATHS$REPO/daemon:$REPO/clients/python:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
step imports 60 "" "$PY" -c '
import importlib, sys
missing = []
for name in ("grpc", "grpc_health.v1.health", "grpc_reflection.v1alpha.reflection",
             "google.protobuf", "google.rpc.status_pb2", "pydantic", "structlog", "numpy",
             "onnx", "onnxruntime", "tokenizers", "prometheus_client", "pytest",
             "pytest_asyncio", "pytest_timeout", "h2", "cuda.bindings.runtime",
             "cuda.bindings.nvrtc", "tensord.server.app", "tensord_client"):
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing.append(f"{name}: {exc}")
if missing:
    sys.exit("cannot import:\n  " + "\n  ".join(missing))
import grpc, google.protobuf
print(f"grpcio {grpc.__version__} ({grpc.__file__}), protobuf {google.protobuf.__version__}")
' || { echo "run-offline: packages are missing (make gpu-wheels, and carry build/gpu-wheels)" >&2; finish 2; }

# 3. The facts; the CUDA probe must see the device nvidia-smi lists.
step facts 120 "" "$PY" tests/gpu/facts.py "$RESULTS/device.json" ||
    { echo "run-offline: the CUDA probe sees no device (device.json says why)" >&2; finish 2; }

# 4. Every GPU test; a skip is a failure.
SELECT=()
NOTE=""
if ! "$PY" -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())'; then
    SELECT=(-m "not ort_gpu")
    NOTE="no onnxruntime-gpu: the ort_gpu tests were deselected (tests/gpu/ort-gpu-install.sh)"
    echo "run-offline: $NOTE"
fi
step gpu-tests 330 "$NOTE" env TENSORD_REQUIRE_GPU=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
    "$PY" -m pytest tests/gpu -p pytest_asyncio.plugin -p pytest_timeout -p no:cacheprovider \
    -rA --junitxml="$RESULTS/gpu-tests.xml" "${SELECT[@]}"

# 5. The figures.
step kernel-bench 150 "" "$PY" benchmarks/kernel_bench.py --reps 20 --requests 100 \
    --out "$RESULTS/kernels.json"
step gpu-bench 120 "" "$PY" benchmarks/gpu_bench.py --out "$RESULTS/gpu.json"

# 6. The verdict.
finish
