"""The fp16 CUDA model-builder folder of the Generate benchmark's Llama, for the GPU calls.

    .venv/bin/python -m tests.gpu.builder_fp16        (what `make gpu-models` runs)

The GPU host has no network and no torch-free builder, so the folder is built here, with
the pinned genai venv (tests/genai_models.py), and carried:

    build/gpu-models/llama-fp16-cuda/                 the builder's folder as a GPU user
                                                      downloads it (-p fp16 -e cuda):
                                                      genai_config.json, model.onnx(.data),
                                                      the tokenizer files
    build/gpu-models/llama-fp16-cuda.reference.json   transformers' greedy tokens (float32
                                                      weights) after each of PROMPTS, with
                                                      every step's top-2 logit gap
    build/gpu-models/llama-fp16-cuda.key              the build's cache key
    build/gpu-models/llama-optimum-fp32/              the Optimum export of the same weights
                                                      (benchmarks/hf_llama.py), as exported
    build/gpu-models/llama-optimum-fp16/              that export converted to float16 by
                                                      ONNX Runtime's transformers tools
                                                      (float16.convert_float_to_float16,
                                                      inputs and outputs too: what
                                                      `optimum-cli onnxruntime optimize -O4`
                                                      writes), its pasts float16

The model is benchmarks/hf_llama.py's LLAMA (hidden 256, 4 layers, 4 heads sharing 2 KV
heads, intermediate 512, context 2048) on the tests' tiny-Llama defaults (vocab 2048, the
demo tokenizer, seed 0). A folder whose key matches is reused; anything else is built again
(about 10 s once the genai venv exists) and copied into place whole. The module imports
nothing beyond the standard library, so the GPU tests read its constants there.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "build" / "gpu-models"
NAME = "llama-fp16-cuda"
FOLDER = ROOT / NAME
REFERENCE = ROOT / f"{NAME}.reference.json"
KEY = ROOT / f"{NAME}.key"
OPTIMUM_FP32 = ROOT / "llama-optimum-fp32"
OPTIMUM_FP16 = ROOT / "llama-optimum-fp16"
CARRY_LIMIT = 64 * 2**20
"""What one device call may carry, the work tree included."""

VOCAB = 2048
NEW_TOKENS = 32
"""Greedy tokens of the reference after each prompt."""


def _prompt(length: int, offset: int) -> tuple[int, ...]:
    """A fixed prompt of ordinary token ids (none of the special ids 0..2)."""
    return tuple(3 + (offset + 131 * i * i + 17 * i) % (VOCAB - 3) for i in range(length))


PROMPTS: tuple[tuple[int, ...], ...] = tuple(
    _prompt(n, offset) for n, offset in ((5, 7), (32, 3), (77, 19), (300, 41))
)
"""Short, the benchmark's 32, and two longer ones: the streams the GPU test staggers."""

FP16_TIE = 0.1
"""A step whose reference top-2 logit gap is below this is a near tie in float16: the
graph computes in float16 and transformers in float32 (logits of magnitude 9 to 14 here;
the folder run on the CPU provider moved top-2 gaps by up to 0.04), so either token may
come first; it and every later step are not compared (17, 16, 13 and 17 of the 32
reference tokens are compared)."""


def family_kwargs() -> dict[str, Any]:
    """The transformers LlamaConfig arguments: the tests' tiny Llama at benchmark size."""
    from tests.generate_reference import benchmark_module
    from tests.hf_families import _LLAMA_LIKE

    return {**_LLAMA_LIKE, **benchmark_module("hf_llama").LLAMA}


def build(root: Path = ROOT) -> Path:
    """The folder under `root` (built, or reused when its key matches)."""
    from tests.genai_models import BuilderFamily, models_key

    family = BuilderFamily(
        "llama_fp16_cuda",
        "LlamaConfig",
        family_kwargs(),
        precision="fp16",
        execution_provider="cuda",
    )
    key = models_key([family.spec(PROMPTS, NEW_TOKENS)])
    root.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{root.name}.lock").open("a") as lock:  # one build or copy at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(family, key, root)


def _build_locked(family: Any, key: str, root: Path) -> Path:
    from tests.genai_models import build_models

    folder, reference, stamp = root / NAME, root / f"{NAME}.reference.json", root / f"{NAME}.key"
    current = stamp.is_file() and stamp.read_text().strip() == key
    if current and folder.is_dir() and reference.is_file():
        print(f"gpu-models: {_shown(folder)} is current (key {key})")
        return folder
    built = build_models([family], PROMPTS, NEW_TOKENS)[family.name]
    assert built.reference is not None
    stamp.unlink(missing_ok=True)  # written last: a half-copied folder is never current
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(built.path, folder)
    shutil.copyfile(built.reference, reference)
    stamp.write_text(key + "\n")
    print(f"gpu-models: {_shown(folder)} built (key {key})")
    return folder


def folder_bytes(root: Path = ROOT) -> int:
    """Bytes of every file under `root` (what carrying it moves)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def report(root: Path = ROOT) -> None:
    """Print the folder's size and what it fits beside in one call's carry."""
    size = folder_bytes(root)
    parts = REPO / "build" / "ort-gpu-parts"
    parts_size = sum(p.stat().st_size for p in parts.glob("*.part-*")) if parts.is_dir() else 0
    config = json.loads((root / NAME / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    print(
        f"gpu-models: {_shown(root)} holds {size / 2**20:.1f} MiB ({size} bytes); "
        f"{decoder['num_hidden_layers']} layers, hidden {decoder['hidden_size']}, "
        f"providers {[next(iter(o)) for o in decoder['session_options']['provider_options']]}"
    )
    if parts_size:
        beside = size + parts_size
        verdict = "fits" if beside < CARRY_LIMIT else "does not fit"
        print(
            f"gpu-models: beside both onnxruntime-gpu parts ({parts_size / 2**20:.1f} MiB) it "
            f"makes {beside / 2**20:.1f} MiB before the work tree: {verdict} in one call's "
            f"{CARRY_LIMIT // 2**20} MiB"
        )


def _shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def build_optimum(root: Path = ROOT) -> tuple[Path, Path]:
    """The benchmark Llama's Optimum export (same weights as the builder folder) under
    `root` as it is, and converted to float16; rebuilt when the export changes."""
    import hashlib

    from tests.generate_reference import benchmark_module

    export = benchmark_module("hf_llama").optimum_llama()
    key = hashlib.sha256((export / "model.onnx").read_bytes()).hexdigest()
    fp32, fp16 = root / OPTIMUM_FP32.name, root / OPTIMUM_FP16.name
    stamp = root / "llama-optimum.key"
    if stamp.is_file() and stamp.read_text().strip() == key and fp32.is_dir() and fp16.is_dir():
        print(f"gpu-models: {_shown(fp32)} and {_shown(fp16)} are current")
        return fp32, fp16
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    stamp.unlink(missing_ok=True)
    for folder in (fp32, fp16):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(export, folder, ignore=shutil.ignore_patterns(".built"))
    half = convert_float_to_float16(onnx.load(str(export / "model.onnx")), keep_io_types=False)
    onnx.save(half, str(fp16 / "model.onnx"))
    stamp.write_text(key + "\n")
    print(f"gpu-models: {_shown(fp32)} and {_shown(fp16)} built")
    return fp32, fp16


def main() -> int:
    build()
    build_optimum()
    report(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
