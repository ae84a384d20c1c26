#!/usr/bin/env bash
# Split a wheel into parts for tests/gpu/ort-gpu-install.sh, with their checksums.
#
#   tests/gpu/ort-gpu-parts.sh WHEEL OUT_DIR [PART_SIZE]      (PART_SIZE: split's -b; 48M)
#
# OUT_DIR gets WHEEL's name with .part-00, .part-01, ... and SHA256SUMS (each part, then
# the whole wheel). `make gpu-ort-parts` runs it on the onnxruntime-gpu wheel.
set -euo pipefail
wheel=$1 out=$2 size=${3:-48M}
name=$(basename "$wheel")
mkdir -p "$out"
rm -f "$out/$name".part-* "$out/SHA256SUMS"
split -b "$size" -d -a 2 "$wheel" "$out/$name.part-"
(cd "$out" && sha256sum "$name".part-*) >"$out/SHA256SUMS"
(cd "$(dirname "$wheel")" && sha256sum "$name") >>"$out/SHA256SUMS"
ls -l "$out"
