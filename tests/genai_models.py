"""Tiny onnxruntime-genai "model builder" folders of several Hugging Face families, with
transformers' greedy references, for the Generate path on builder folders.

A builder folder (genai_config.json, model.onnx with com.microsoft.GroupQueryAttention,
the tokenizer files) is what a user gets from `python -m onnxruntime_genai.models.builder`.
Making one needs torch, transformers >= 5 and onnxruntime-genai, which clash with tensord's
venv, so they live in a pinned venv of their own and tests/genai_build.py runs there:

    build/genai-venv/                       tests/genai_requirements.txt, made on first use
    build/genai-models/<key>/<name>/        the builder folder
    build/genai-models/<key>/<name>.reference.json     transformers' greedy tokens and
                                                       each step's top-2 logit gap
    build/genai-models/<key>/<name>.transformers/      the checkpoint it was built from

<key> hashes the models' specs, the prompts, genai_build.py, the demo tokenizer and the
requirements, so a change to any of them builds afresh and an unchanged set is reused.
All models of one call are built in one subprocess (torch imports once), into a temporary
folder renamed into place when complete: an interrupted build is never reused.

In a test (tensord's venv):

    models = build_models(FAMILIES.values(), PROMPTS, NEW_TOKENS)  # or build_families()
    for run, tokens in zip(models["llama"].reference_runs(), outputs):
        run.check(tokens)           # token for token, up to the first near tie

From a shell (what `make genai-venv` runs before the tests):

    .venv/bin/python -m tests.genai_models     # the venv, then FAMILIES with PROMPTS
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.hf_families import FAMILIES as HF_FAMILIES
from tests.hf_families import TRANSFORMERS_TIE, VOCAB

if TYPE_CHECKING:
    from tests.generate_reference import ReferenceRun

REPO = Path(__file__).resolve().parent.parent
GENAI_VENV = REPO / "build" / "genai-venv"
MODELS_ROOT = REPO / "build" / "genai-models"
REQUIREMENTS = REPO / "tests" / "genai_requirements.txt"
BUILD_SCRIPT = REPO / "tests" / "genai_build.py"
HF_FAMILIES_FILE = REPO / "tests" / "hf_families.py"
"""The build's model, tokenizer and reference code (tests/genai_build.py imports it)."""
DEMO_TOKENIZER = REPO / "daemon" / "tensord" / "demo" / "tokenizer.py"
_STAMP = ".requirements.sha256"
_OUTPUT_TAIL = 60
"""Lines of pip's or the build's output a failure carries."""
_UNUSED_DAYS = 14
"""Built sets nobody asked for in this many days are removed when another is built."""


class GenaiSetupError(RuntimeError):
    """The genai venv or the builder folders could not be made (pip's or the build's
    output is in the message)."""


@dataclass(frozen=True, slots=True)
class BuilderFamily:
    """One tiny builder folder: a transformers config with seeded random weights, run
    through the model builder with this precision, execution provider and extra options."""

    name: str
    config_class: str
    kwargs: dict[str, Any]
    precision: str = "fp32"
    execution_provider: str = "cpu"
    extra_options: tuple[str, ...] = ()
    """The builder's --extra_options, as KEY=VALUE strings."""
    seed: int = 0
    reference: bool = True
    """Whether transformers' greedy reference is made (False: the folder alone)."""

    def spec(self, prompts: Sequence[Sequence[int]], new_tokens: int) -> dict[str, Any]:
        """The entry genai_build.py reads for this family."""
        return {
            "name": self.name,
            "config_class": self.config_class,
            "kwargs": self.kwargs,
            "seed": self.seed,
            "precision": self.precision,
            "execution_provider": self.execution_provider,
            "extra_options": list(self.extra_options),
            "prompts": [list(map(int, p)) for p in prompts] if self.reference else [],
            "new_tokens": new_tokens,
        }


@dataclass(frozen=True, slots=True)
class BuiltModel:
    """One built family: its builder folder, the checkpoint it came from, its reference."""

    name: str
    path: Path
    """The builder folder (genai_config.json, model.onnx, model.onnx.data, tokenizer.json)."""
    hf_path: Path
    """The transformers checkpoint (config.json, model.safetensors, the tokenizer)."""
    reference: Path | None = None
    """transformers' greedy reference (JSON), None when the family has none."""

    def genai_config(self) -> dict[str, Any]:
        """The builder's genai_config.json."""
        return json.loads((self.path / "genai_config.json").read_text())

    def hf_config(self) -> dict[str, Any]:
        """The transformers checkpoint's config.json."""
        return json.loads((self.hf_path / "config.json").read_text())

    def reference_runs(self) -> list[ReferenceRun]:
        """The reference's runs, one per prompt (see load_reference)."""
        if self.reference is None:
            raise ValueError(f"{self.name} was built without a reference")
        return load_reference(self.reference)


def load_reference(path: Path) -> list[ReferenceRun]:
    """A <name>.reference.json as ReferenceRuns, one per prompt in the order given: the
    greedy tokens and each step's top-2 gap, with transformers' near-tie threshold, so
    `run.check(tokens)` stops comparing at the first near tie."""
    from tests.generate_reference import ReferenceRun

    data = json.loads(path.read_text())
    return [ReferenceRun.from_record(run, TRANSFORMERS_TIE) for run in data["runs"]]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created), so that two test sessions never build the
    same venv or folders at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _shown(path: Path) -> Path:
    """path relative to the repository where it lies inside it (for messages)."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def _digest(*parts: bytes) -> str:
    """One SHA-256 over the parts, each hashed alone first (so their boundaries count)."""
    sha = hashlib.sha256()
    for part in parts:
        sha.update(hashlib.sha256(part).digest())
    return sha.hexdigest()


def _run(command: Sequence[str], what: str, env: dict[str, str] | None = None) -> str:
    """Run command with its output captured; returns it, or raises GenaiSetupError with
    its last lines."""
    done = subprocess.run(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-_OUTPUT_TAIL:])
        raise GenaiSetupError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def genai_python(venv_dir: Path = GENAI_VENV) -> Path:
    """The genai venv's interpreter, the venv made from tests/genai_requirements.txt on
    first use and made again when that file changes (its hash is the stamp, written last:
    a half-made venv is never taken for a whole one)."""
    python = venv_dir / "bin" / "python"
    digest = _digest(REQUIREMENTS.read_bytes())
    stamp = venv_dir / _STAMP
    with _locked(venv_dir.parent / f"{venv_dir.name}.lock"):
        if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
            return python
        print(f"genai venv: creating {_shown(venv_dir)} from {_shown(REQUIREMENTS)}", flush=True)
        start = time.perf_counter()
        shutil.rmtree(venv_dir, ignore_errors=True)
        venv.create(venv_dir, with_pip=True)
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        _run([*pip, "-r", str(REQUIREMENTS)], f"pip install -r {REQUIREMENTS.name}")
        stamp.write_text(digest + "\n")
        print(f"genai venv: ready in {time.perf_counter() - start:.1f} s", flush=True)
    return python


def models_key(models: Sequence[dict[str, Any]]) -> str:
    """The cache key of one build: the specs and everything that shapes the folders."""
    specs = json.dumps(models, sort_keys=True).encode()
    sources = [
        p.read_bytes() for p in (BUILD_SCRIPT, HF_FAMILIES_FILE, DEMO_TOKENIZER, REQUIREMENTS)
    ]
    return _digest(specs, *sources)[:16]


def _built(root: Path, families: Iterable[BuilderFamily]) -> dict[str, BuiltModel]:
    models = {}
    for family in families:
        reference = root / f"{family.name}.reference.json"
        models[family.name] = BuiltModel(
            family.name,
            root / family.name,
            root / f"{family.name}.transformers",
            reference if reference.exists() else None,
        )
    return models


def _prune(root: Path) -> None:
    """Remove temporaries of interrupted builds and sets unused for _UNUSED_DAYS (a set's
    mtime is touched each time it is taken from the cache). Runs under the lock."""
    cutoff = time.time() - _UNUSED_DAYS * 86400
    for entry in root.iterdir():
        if entry.is_dir() and (entry.name.startswith(".tmp-") or entry.stat().st_mtime < cutoff):
            shutil.rmtree(entry, ignore_errors=True)


def _build(python: Path, models: list[dict[str, Any]], final: Path) -> None:
    """Run genai_build.py on the models into a temporary sibling of final, then rename it
    into place: a folder under its key is always complete."""
    _prune(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps({"root": str(tmp), "models": models}, indent=1))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["HF_HUB_OFFLINE"] = "1"
        output = _run([str(python), str(BUILD_SCRIPT), str(spec_path)], "genai_build.py", env)
        print(output, end="", flush=True)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_models(
    families: Iterable[BuilderFamily],
    prompts: Sequence[Sequence[int]] = (),
    new_tokens: int = 0,
    root: Path = MODELS_ROOT,
) -> dict[str, BuiltModel]:
    """Each family's builder folder (and, for families with a reference, transformers'
    greedy `new_tokens` tokens after each prompt), by name; built in one subprocess of the
    genai venv, or taken from the cache when the same set was built before."""
    families = list(families)
    names = [f.name for f in families]
    if len(set(names)) != len(names):
        raise ValueError(f"family names repeat: {names}")
    models = [f.spec(prompts if new_tokens else (), new_tokens) for f in families]
    final = root / models_key(models)
    start = time.perf_counter()
    with _locked(root / ".lock"):
        if final.is_dir():
            os.utime(final)
            print(f"genai models: {len(models)} cached in {_shown(final)}", flush=True)
        else:
            _build(genai_python(), models, final)
            took = time.perf_counter() - start
            print(
                f"genai models: built {len(models)} in {took:.1f} s ({_shown(final)})", flush=True
            )
    return _built(final, families)


def _hf_kwargs(name: str, **extra: Any) -> dict[str, Any]:
    """tests/hf_families' tiny config of that family, with `extra` on top."""
    return {**HF_FAMILIES[name].kwargs, **extra}


def _prompt(length: int, offset: int) -> list[int]:
    """A fixed prompt of ordinary token ids (no special ids 0..2)."""
    return [3 + (offset + 131 * i * i + 17 * i) % (VOCAB - 3) for i in range(length)]


PROMPTS: tuple[tuple[int, ...], ...] = tuple(
    tuple(_prompt(n, offset))
    for n, offset in ((4, 11), (13, 5), (40, 29), (7, 3), (22, 17), (31, 23))
)
"""Six lengths: short, longer than a window of 8, longer than every window (40 > 16)."""
NEW_TOKENS = 24

FAMILIES: dict[str, BuilderFamily] = {
    f.name: f
    for f in [
        BuilderFamily("llama", "LlamaConfig", _hf_kwargs("llama")),
        BuilderFamily("qwen2", "Qwen2Config", _hf_kwargs("qwen2")),
        BuilderFamily("qwen3", "Qwen3Config", _hf_kwargs("qwen3")),
        # A window of 16 on every layer. transformers' Mistral windows all layers, but the
        # builder windows only the layers that `layer_types` marks "sliding_attention"
        # (without it: no window in the graph, yet genai_config's sliding_window has
        # window_size 16 and layers [], which onnxruntime-genai itself fails to run).
        BuilderFamily(
            "mistral_sw16",
            "MistralConfig",
            _hf_kwargs("mistral_sw16", layer_types=["sliding_attention"] * 2),
        ),
        # A window of 8 on layer 1 only (Qwen2 windows the layers from max_window_layers on).
        BuilderFamily(
            "qwen2_sw8",
            "Qwen2Config",
            _hf_kwargs("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1),
        ),
        # original_max_position_embeddings equal to max_position_embeddings: otherwise the
        # builder takes Phi-3's LongRoPE path, which this config has no factors for.
        BuilderFamily(
            "phi3", "Phi3Config", _hf_kwargs("phi3", original_max_position_embeddings=256)
        ),
        # A window of 8 on layer 0, logit soft-capping, query_pre_attn_scalar.
        BuilderFamily("gemma2", "Gemma2Config", _hf_kwargs("gemma2")),
        # transformers 5 nests rope_parameters per layer type, which the builder cannot
        # read (KeyError 'rope_type'); the flat keys beside the nested ones are what it reads
        # (rope_local_base_freq: the sliding layers' theta), the nested ones what
        # transformers reads; both say the same.
        BuilderFamily(
            "gemma3",
            "Gemma3TextConfig",
            _hf_kwargs(
                "gemma3_text",
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 1_000_000.0,
                    "rope_local_base_freq": 10_000.0,
                    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                },
            ),
        ),
        # Built for CUDA in bfloat16: ONNX Runtime's CPU provider has no bfloat16 MatMul, so
        # a CPU session refuses it (an fp16 CUDA folder, by contrast, loads and runs on the CPU).
        BuilderFamily(
            "llama_bf16_cuda",
            "LlamaConfig",
            _hf_kwargs("llama"),
            precision="bf16",
            execution_provider="cuda",
            reference=False,
        ),
    ]
}
"""The tests' builder families, by name."""


def build_families() -> dict[str, BuiltModel]:
    """FAMILIES built with PROMPTS and NEW_TOKENS (what `make test` prepares)."""
    return build_models(FAMILIES.values(), PROMPTS, NEW_TOKENS)


def main() -> int:
    genai_python()
    build_families()
    return 0


if __name__ == "__main__":
    sys.exit(main())
