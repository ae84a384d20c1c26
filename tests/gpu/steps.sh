# shellcheck shell=bash
# What the GPU calls share (tests/gpu/run-offline.sh, tests/gpu/run-ort-gpu.sh): timed steps
# under one deadline, a record of each in steps.tsv, the hooks that rerun one step or one
# test, and the summary. Sourced first; open_results sets RESULTS, PY and SITE, the call
# its DEADLINE.
#
# TENSORD_GPU_STEPS   comma-separated step names: run only these (and the set-up they
#                     need); the summary says the run was partial.
# TENSORD_GPU_TESTS   pytest arguments (node ids, -k EXPR) for the test step instead of
#                     the whole selection.

# want NAME: whether TENSORD_GPU_STEPS (unset: every step) asks for step NAME.
want() {
    [ -z "${TENSORD_GPU_STEPS:-}" ] && return 0
    case ",$TENSORD_GPU_STEPS," in *",$1,"*) return 0 ;; esac
    return 1
}

# step NAME CAP_S NOTE COMMAND...: run it for at most CAP_S seconds (less where the call's
# DEADLINE is nearer) and record "name rc seconds note" in steps.tsv. A step that would
# start with under 5 s left is recorded as not run (rc 125).
step() {
    local name=$1 limit=$2 note=$3 start rc ms left
    shift 3
    left=$((DEADLINE - $(date +%s)))
    if [ "$left" -lt 5 ]; then
        printf '%s\t125\t0\tnot run: the call'"'"'s time was spent\n' "$name" >>"$RESULTS/steps.tsv"
        return 125
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "--- $name (cap ${limit} s; $(($(date +%s) - STARTED)) s into the call)"
    start=$(date +%s%N)
    # --kill-after past the benchmarks' own 10 s grace for the daemons they started.
    timeout --kill-after=15 "$limit" "$@"
    rc=$?
    case $rc in 124 | 137) note="${note:+$note; }stopped at its ${limit} s cap" ;; esac
    ms=$((($(date +%s%N) - start) / 1000000))
    printf '%s\t%s\t%d.%03d\t%s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) "$note" \
        >>"$RESULTS/steps.tsv"
    return "$rc"
}

# gpu_or_stop: exit 2 at once, saying why, where no NVIDIA GPU is visible.
gpu_or_stop() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        printf 'gpu-visible\t2\t0\tnvidia-smi is not on the PATH: no NVIDIA driver on this host\n' \
            >>"$RESULTS/steps.tsv"
        echo "$CALL: no NVIDIA GPU here: nvidia-smi is not on the PATH (no NVIDIA driver)." >&2
        echo "$CALL: run this on the GPU host; nothing was measured." >&2
        finish 2
    fi
    if ! step gpu-visible "${CAP_VISIBLE:-10}" "" bash -c 'nvidia-smi -L | grep -q "^GPU "'; then
        echo "$CALL: nvidia-smi lists no GPU:" >&2
        nvidia-smi -L >&2
        finish 2
    fi
    nvidia-smi -L
}

# use_wheels: put the packages of `make gpu-wheels` on the path (the folders in
# TENSORD_GPU_WHEELS, default build/gpu-wheels and build/ort-cpu-wheel, as carried),
# installing them into $SITE unless this machine already has exactly those there (a warm
# machine between calls).
use_wheels() {
    local folders=${TENSORD_GPU_WHEELS:-build/gpu-wheels build/ort-cpu-wheel} folder
    local found=()
    for folder in $folders; do
        compgen -G "$folder/*.whl" >/dev/null && found+=("$folder"/*.whl)
    done
    PATHS=""
    if [ "${#found[@]}" -gt 0 ]; then
        local stamp
        stamp="$SITE/.installed-$(cat "${found[@]}" | cksum | cut -d' ' -f1)"
        if [ ! -e "$stamp" ]; then
            rm -rf "$SITE"
            step wheels "${CAP_WHEELS:-30}" "${#found[@]} wheels from $folders" \
                "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps \
                --no-compile --no-cache-dir --target "$SITE" "${found[@]}" ||
                { echo "$CALL: the wheels in $folders did not install" >&2; finish 2; }
            touch "$stamp"
        fi
        PATHS="$SITE:"
    elif [ -d "$SITE" ]; then
        echo "$CALL: no wheels carried; using those an earlier call installed in $SITE"
        PATHS="$SITE:"
    else
        echo "$CALL: no wheels in $folders (make gpu-wheels, and carry them): the host's packages"
    fi
}

# finish [RC]: the summary (summary.json and one screen); exit with RC, else its verdict.
finish() {
    local rc=${1:-}
    "$PY" tests/gpu/summary.py "$RESULTS"
    local verdict=$?
    local count
    count=$(find "$RESULTS" -maxdepth 1 -type f | wc -l)
    if [ "$count" -gt 8 ]; then  # at most 8 files come back from a call
        echo "$CALL: $count files in $RESULTS, more than the 8 a call brings back" >&2
        verdict=1
    fi
    exec >&- 2>&-  # let tee write the last lines before the call ends
    # A process a capped step left behind may still hold the log's pipe: wait 5 s at most.
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$TEE" 2>/dev/null || break; sleep 0.5; done
    exit "${rc:-$verdict}"
}

# open_results CALL_NAME [RESULTS_DIR]: the interpreter (PY), the wheels' site (SITE), the
# results folder (RESULTS: RESULTS_DIR, else $OUT, else build/gpu-run) emptied of this
# call's files, and a log of everything printed.
open_results() {
    CALL=$1
    RESULTS=${2:-${OUT:-build/gpu-run}}
    PY=${PYTHON:-python3}
    SITE=${TENSORD_GPU_SITE:-/tmp/tensord-gpu-site}
    mkdir -p "$RESULTS" || exit 2
    RESULTS=$(cd "$RESULTS" && pwd)
    rm -f "$RESULTS"/{steps.tsv,run.log,summary.json}
    exec > >(tee -a "$RESULTS/run.log") 2>&1
    TEE=$!
    STARTED=$(date +%s)
    [ -n "${TENSORD_GPU_STEPS:-}" ] && echo "$CALL: only the steps $TENSORD_GPU_STEPS"
    true
}
