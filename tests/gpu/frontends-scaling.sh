#!/usr/bin/env bash
# The frontends scaling run on the 16-core GPU host (CPU only), after run-offline.sh has
# installed the wheel bundle there in the same session.
#
#   tests/gpu/frontends-scaling.sh [RESULTS_DIR]    (default: $OUT where set, else build/gpu-run)
#
# Runs benchmarks/frontends_bench.py --scaling (the daemon on half the cores, the load on
# the other half; N = 1, 2, 4 frontends) and then the CPU-per-role run, with the packages
# run-offline.sh put in $TENSORD_GPU_SITE. Figures go to RESULTS_DIR/frontends-*.txt and
# the JSON results beside them.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
RESULTS=${1:-${OUT:-build/gpu-run}}
mkdir -p "$RESULTS" || exit 2
PY=${PYTHON:-python3}
SITE=${TENSORD_GPU_SITE:-/tmp/tensord-gpu-site}
if [ ! -d "$SITE" ]; then
    echo "frontends-scaling: no packages in $SITE: run tests/gpu/run-offline.sh first" >&2
    exit 2
fi
export PYTHONPATH="$SITE:$REPO/daemon:$REPO/clients/python:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nproc
timeout 330 "$PY" benchmarks/frontends_bench.py --scaling --quick --frontends 1,2,4 \
    --results-dir "$RESULTS" 2>&1 | tee "$RESULTS/frontends-scaling.txt"
timeout 200 "$PY" benchmarks/frontends_bench.py --quick --results-dir "$RESULTS" 2>&1 |
    tee "$RESULTS/frontends-cpu.txt"
