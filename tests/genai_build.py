"""Build tiny onnxruntime-genai "model builder" folders and transformers' greedy references.

Run by the genai venv's python (tests/genai_models.py makes it), never imported by
tensord's venv: the builder needs transformers >= 5 and onnxruntime-genai, which clash
with tensord's own pins.

    python tests/genai_build.py SPEC.json

SPEC.json:

    {"root": "/abs/dir", "models": [{"name": "llama", "config_class": "LlamaConfig",
      "kwargs": {...}, "seed": 0, "precision": "fp32", "execution_provider": "cpu",
      "extra_options": ["KEY=VALUE", ...], "prompts": [[1, 5, 9], ...], "new_tokens": 16}]}

For each model: a seeded random-weight transformers model of that config is saved with
the demo tokenizer to <root>/<name>.transformers/, the model builder (in this process: torch and
transformers import once for all models) writes <root>/<name>/ (genai_config.json,
model.onnx, the tokenizer files: the folder as a user gets it), and, when "prompts" is not
empty, <root>/<name>.reference.json holds transformers' greedy continuation of each prompt
with every step's top-2 logit gap. Nothing is downloaded (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# Offline, and quiet: progress bars and transformers' notices are not about the build.
# Set before transformers and huggingface_hub are imported: they read these at import.
for _name, _value in (
    ("HF_HUB_OFFLINE", "1"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ("TQDM_DISABLE", "1"),
    ("TRANSFORMERS_VERBOSITY", "error"),
    ("TOKENIZERS_PARALLELISM", "false"),
):
    os.environ.setdefault(_name, _value)

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "daemon")]

import torch  # noqa: E402
from onnxruntime_genai.models.builder import create_model, parse_extra_options  # noqa: E402

from tests.hf_families import Family, build_model, greedy_steps, hf_tokenizer  # noqa: E402

BUILDER_FILES = ("genai_config.json", "model.onnx", "tokenizer.json", "tokenizer_config.json")
"""What every builder folder must hold (model.onnx.data too when the weights are external)."""


def save_hf_model(spec: dict[str, Any], hf_dir: Path) -> Any:
    """The spec's seeded random-weight model, saved with the demo tokenizer to hf_dir (as
    tests/hf_families builds the Optimum tests' models)."""
    family = Family(spec["name"], spec["config_class"], spec["kwargs"])
    model = build_model(family, spec.get("seed", 0))
    model.save_pretrained(hf_dir)
    hf_tokenizer().save_pretrained(hf_dir)
    return model


def run_builder(spec: dict[str, Any], hf_dir: Path, out_dir: Path, cache_dir: Path) -> None:
    """The model builder on hf_dir, as `python -m onnxruntime_genai.models.builder -i hf_dir
    -o out_dir -p PRECISION -e EP --extra_options ...` runs it; its chatter is kept and
    shown only when it fails."""
    args = (
        None,
        str(hf_dir),
        str(out_dir),
        spec.get("precision", "fp32"),
        spec.get("execution_provider", "cpu"),
        str(cache_dir),
    )
    log = io.StringIO()
    try:
        with (
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            extra = parse_extra_options(*args, list(spec.get("extra_options", [])))
            create_model(*args, **extra)
    except Exception:
        sys.stderr.write(log.getvalue())
        raise
    missing = [name for name in BUILDER_FILES if not (out_dir / name).is_file()]
    if missing:
        raise RuntimeError(f"{spec['name']}: the builder left out {', '.join(missing)}")


def build_one(spec: dict[str, Any], root: Path) -> None:
    """One model: the transformers checkpoint, its builder folder and its reference."""
    name = spec["name"]
    hf_dir, out_dir = root / f"{name}.transformers", root / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = save_hf_model(spec, hf_dir)
    run_builder(spec, hf_dir, out_dir, root / ".builder-cache")
    if spec.get("prompts"):
        runs = greedy_steps(model, spec["prompts"], spec["new_tokens"])
        reference = {"name": name, "new_tokens": spec["new_tokens"], "runs": runs}
        (root / f"{name}.reference.json").write_text(json.dumps(reference, indent=1))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text())
    root = Path(spec["root"])
    root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    start = time.perf_counter()
    for model in spec["models"]:
        began = time.perf_counter()
        build_one(model, root)
        print(f"genai_build: {model['name']} in {time.perf_counter() - began:.1f} s", flush=True)
    shutil.rmtree(root / ".builder-cache", ignore_errors=True)
    total = time.perf_counter() - start
    print(f"genai_build: {len(spec['models'])} models in {total:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
