#!/usr/bin/env bash
# Bring onnxruntime-gpu to an offline GPU host in parts small enough for each transfer.
#
#   tests/gpu/ort-gpu-install.sh [PARTS_DIR]     (default build/ort-gpu-parts)
#
# `make gpu-ort-pack` (where there is network) repacks the onnxruntime-gpu wheel to what
# its CUDA provider needs, as NAME.tar.xz in equal parts NAME.tar.xz.part-NN, with
# SHA256SUMS for every part and for the whole archive. Send the parts over as the
# transfers allow, each with SHA256SUMS, and run this after each: it checks each part it
# finds against SHA256SUMS and keeps it in $TENSORD_ORT_GPU_DIR (/var/tmp/tensord-ort-gpu,
# outside the work tree, so back-to-back calls add up). Once every part is there it joins
# them, checks the archive's sha256 and unpacks it into $TENSORD_ORT_GPU_DIR/site (which
# tests/gpu/run-ort-gpu.sh puts on PYTHONPATH); site/nvidia links to the host's nvidia-*
# wheels (nvidia/cu13/lib, nvidia/cudnn/lib), which is where preload_dlls looks, beside
# the onnxruntime folder. Then tests/gpu/ort_gpu_check.py runs a model on the CUDA
# provider. A later run with every part kept and the same SHA256SUMS goes straight there.
#
# Exit 0 when installed and the model ran on the GPU; 3 while parts are missing; 1 on a
# part or archive whose checksum is wrong (a bad part is deleted); 2 when the host lacks
# the nvidia-* wheels; 4 when the session did not run on CUDAExecutionProvider.
# Environment: PYTHON (python3), TENSORD_ORT_GPU_DIR, TENSORD_NVIDIA_DIR (the nvidia
# folder of the host's site-packages; found with Python when unset).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PARTS=${1:-$REPO/build/ort-gpu-parts}
[ -d "$PARTS" ] && PARTS=$(cd "$PARTS" && pwd)  # the loop below runs in $KEPT
DEST=${TENSORD_ORT_GPU_DIR:-/var/tmp/tensord-ort-gpu}
PY=${PYTHON:-python3}
KEPT=$DEST/parts
SITE=$DEST/site
mkdir -p "$KEPT"

# A new pack (another SHA256SUMS) makes the parts kept from the last one useless.
if [ -f "$PARTS/SHA256SUMS" ]; then
    if [ -f "$KEPT/SHA256SUMS" ] && ! cmp -s "$PARTS/SHA256SUMS" "$KEPT/SHA256SUMS"; then
        echo "a new SHA256SUMS: the parts kept from the last pack are dropped"
        rm -f "$KEPT"/*
    fi
    cp "$PARTS/SHA256SUMS" "$KEPT/"
fi
if [ ! -f "$KEPT/SHA256SUMS" ]; then
    echo "no SHA256SUMS in $PARTS nor in $KEPT (make gpu-ort-pack)" >&2
    exit 1
fi
archive=$(awk '$2 !~ /\.part-[0-9]+$/ {print $2}' "$KEPT/SHA256SUMS")
archive_sha=$(awk -v n="$archive" '$2 == n {print $1}' "$KEPT/SHA256SUMS")
mapfile -t wanted < <(awk '$2 ~ /\.part-[0-9]+$/ {print $2}' "$KEPT/SHA256SUMS" | sort)

cd "$KEPT"
for part in "$PARTS"/*.part-*; do
    [ -e "$part" ] || continue
    name=$(basename "$part")
    cp "$part" "$name.tmp"
    expected=$(awk -v n="$name" '$2 == n {print $1}' SHA256SUMS)
    actual=$(sha256sum "$name.tmp" | cut -d' ' -f1)
    if [ "$expected" != "$actual" ]; then
        rm -f "$name.tmp"
        echo "$name: sha256 $actual, expected ${expected:-none}: not kept" >&2
        exit 1
    fi
    mv "$name.tmp" "$name"
    echo "$name: checked and kept in $KEPT"
done

if [ "$(cat "$SITE/.archive-sha256" 2>/dev/null)" = "$archive_sha" ]; then
    echo "$archive is already unpacked in $SITE"
else
    missing=()
    for p in "${wanted[@]}"; do [ -f "$p" ] || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "kept $((${#wanted[@]} - ${#missing[@]})) of ${#wanted[@]} parts;" \
            "still missing: ${missing[*]}"
        exit 3
    fi
    for p in "${wanted[@]}"; do  # a kept part may have changed since it was checked
        if ! grep " $p\$" SHA256SUMS | sha256sum --check --status; then
            rm -f "$p"
            echo "$p: no longer matches SHA256SUMS: deleted, carry it again" >&2
            exit 1
        fi
    done
    if [ "$(cat "${wanted[@]}" | sha256sum | cut -d' ' -f1)" != "$archive_sha" ]; then
        echo "$archive: the joined parts do not match its sha256 in SHA256SUMS" >&2
        exit 1
    fi
    rm -rf "$SITE" "$SITE.tmp"
    mkdir -p "$SITE.tmp"
    # Python's tarfile and lzma: no xz binary needed. The 'data' filter refuses links
    # out of the folder and absolute names.
    cat "${wanted[@]}" | "$PY" -c '
import sys, tarfile
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz") as tar:
    tar.extractall(sys.argv[1], filter="data")
' "$SITE.tmp"
    echo "$archive_sha" >"$SITE.tmp/.archive-sha256"
    mv "$SITE.tmp" "$SITE"
    echo "unpacked $archive into $SITE ($(du -sm "$SITE" | cut -f1) MiB)"
fi

# preload_dlls (onnxruntime/__init__.py, CUDA 13 builds) loads, from the folder that holds
# the onnxruntime package, nvidia/cu13/lib/libcublasLt.so.13, libcublas.so.13,
# libnvrtc.so.13, libcurand.so.10, libcufft.so.12, libcudart.so.13 and
# nvidia/cudnn/lib/libcudnn.so.9; only then the loader's own search. A link to the whole
# nvidia folder keeps each library's $ORIGIN beside its siblings (cuDNN opens its engine
# libraries from there).
NVIDIA=${TENSORD_NVIDIA_DIR:-$(cd / && env -u PYTHONPATH "$PY" -c '
import os, nvidia
for path in nvidia.__path__:
    if os.path.isfile(os.path.join(path, "cu13", "lib", "libcudart.so.13")):
        print(path)
        break
' 2>/dev/null || true)}
if [ -z "$NVIDIA" ] || [ ! -d "$NVIDIA/cu13/lib" ]; then
    echo "no nvidia/cu13/lib among $PY's packages (nvidia-cuda-runtime, nvidia-cublas, ...):" \
        "set TENSORD_NVIDIA_DIR to the nvidia folder of a site-packages that has them" >&2
    exit 2
fi
ln -sfn "$NVIDIA" "$SITE/nvidia"
for lib in cu13/lib/libcublasLt.so.13 cu13/lib/libcublas.so.13 cu13/lib/libcudart.so.13 \
    cu13/lib/libcurand.so.10 cu13/lib/libnvrtc.so.13 cu13/lib/libcufft.so.12 \
    cudnn/lib/libcudnn.so.9; do
    [ -e "$SITE/nvidia/$lib" ] || echo "note: $NVIDIA has no $lib"
done
echo "$SITE/nvidia -> $NVIDIA"

cd "$REPO"
PYTHONPATH="$SITE" "$PY" tests/gpu/ort_gpu_check.py "$SITE" || exit 4
