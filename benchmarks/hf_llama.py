"""The Generate benchmark's model: a tiny Llama exported as users export theirs.

    build/bench-models/llama/
      pytorch/   transformers checkpoint (seeded random weights, the demo tokenizer)
      optimum/   `text-generation-with-past` export by Optimum: what tensord and the plain
                 loop run
      genai/     the same checkpoint through onnxruntime-genai's model builder
    build/genai-venv/          onnxruntime-genai and its builder's needs, pinned by
                               tests/genai_requirements.txt (it pulls an onnxruntime of its
                               own, so it never shares tensord's venv); the tests' builder
                               folders are made with the same venv (tests/genai_models.py)

The shape is the tests' tiny Llama at benchmark size: hidden 256, 4 layers, 4 attention
heads sharing 2 KV heads, intermediate 512, context 2048. Each part is built once and
reused while its stamp file stands (the genai folder's stamp holds the genai venv's
requirements hash: new pins build it again); nothing is downloaded but PyPI packages for
the genai venv.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "build" / "bench-models" / "llama"

LLAMA = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}


def optimum_llama(root: Path = ROOT) -> Path:
    """The Optimum export's directory (built on first use: needs the export extra)."""
    out = root / "optimum"
    if (out / ".built").exists():
        return out
    sys.path.insert(0, str(REPO))
    from tests.hf_families import _LLAMA_LIKE, Family, export_family

    family = Family("llama", "LlamaConfig", {**_LLAMA_LIKE, **LLAMA})
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    exported = export_family(family, root)
    (root / "llama-pytorch").rename(root / "pytorch")
    exported.rename(out)
    (out / ".built").touch()
    return out


def genai_python() -> Path:
    """The genai venv's interpreter: the tests' pinned venv (build/genai-venv, made from
    tests/genai_requirements.txt on first use)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.genai_models import genai_python as pinned_genai_python

    return pinned_genai_python()


def _genai_stamp() -> str:
    """What the genai folder's .built holds: the requirements it was built under."""
    return hashlib.sha256((REPO / "tests" / "genai_requirements.txt").read_bytes()).hexdigest()


def genai_llama(intra_op_threads: int, root: Path = ROOT) -> tuple[Path, Path]:
    """(the genai venv's python, the model builder's output for the same checkpoint),
    with the session's intra-op threads set as the other runners have them."""
    optimum_llama(root)
    python = genai_python()
    out = root / "genai"
    stamp = out / ".built"
    if not stamp.exists() or stamp.read_text().strip() != _genai_stamp():
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [str(python), "-m", "onnxruntime_genai.models.builder", "-i", str(root / "pytorch"),
             "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(root / "genai-cache")],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stamp.write_text(_genai_stamp() + "\n")
    config_path = out / "genai_config.json"
    config = json.loads(config_path.read_text())
    options = config["model"]["decoder"]["session_options"]
    if intra_op_threads:
        options["intra_op_num_threads"] = intra_op_threads
    else:
        options.pop("intra_op_num_threads", None)
    config_path.write_text(json.dumps(config, indent=4))
    return python, out
