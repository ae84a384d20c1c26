#!/usr/bin/env bash
# Bring onnxruntime-gpu to an offline GPU host in parts small enough for each transfer.
#
#   tests/gpu/ort-gpu-install.sh [PARTS_DIR]     (default build/ort-gpu-parts)
#
# `make gpu-ort-parts` (where there is network) downloads the onnxruntime-gpu wheel for
# Python 3.12 manylinux x86-64 and splits it into build/ort-gpu-parts/*.part-NN, with
# SHA256SUMS for every part and for the whole wheel. Send the parts over as the transfers
# allow, one or more at a time, and run this after each: it checks each part it finds
# against SHA256SUMS and keeps it in $TENSORD_ORT_GPU_DIR (/var/tmp/tensord-ort-gpu,
# outside the work tree). Once every part is there it joins them, checks the wheel's
# sha256 and installs it with --no-index into $TENSORD_ORT_GPU_DIR/site, where
# tests/gpu/run-offline.sh finds it. Exit 0 when installed, 3 while parts are missing,
# 1 on a part or wheel whose checksum is wrong (it is deleted).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PARTS=${1:-$REPO/build/ort-gpu-parts}
DEST=${TENSORD_ORT_GPU_DIR:-/var/tmp/tensord-ort-gpu}
PY=${PYTHON:-python3}
mkdir -p "$DEST/parts"

[ -f "$PARTS/SHA256SUMS" ] || { echo "no $PARTS/SHA256SUMS (make gpu-ort-parts)" >&2; exit 1; }
cp "$PARTS/SHA256SUMS" "$DEST/parts/"
cd "$DEST/parts"
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
    echo "$name: checked and kept"
done

wheel=$(awk '$2 !~ /\.part-/ {print $2}' SHA256SUMS)
missing=$(awk '$2 ~ /\.part-/ {print $2}' SHA256SUMS | while read -r p; do [ -f "$p" ] || echo "$p"; done)
if [ -n "$missing" ]; then
    echo "parts still missing:" $missing
    exit 3
fi
cat $(awk '$2 ~ /\.part-/ {print $2}' SHA256SUMS | sort) >"$DEST/$wheel"
if ! (cd "$DEST" && grep " $wheel\$" parts/SHA256SUMS | sha256sum --check --status); then
    rm -f "$DEST/$wheel"
    echo "$wheel: the joined parts do not match its sha256" >&2
    exit 1
fi
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$DEST/site" "$DEST/$wheel"
rm -f "$DEST/$wheel"
echo "installed $wheel into $DEST/site"
PYTHONPATH="$DEST/site" "$PY" -c '
import onnxruntime as ort
ort.preload_dlls()
print("onnxruntime", ort.__version__, ort.get_available_providers())
'
