"""Scanning a model repository directory: one subdirectory per model, numbered versions.

repository/
  mlp/
    model.toml          optional settings
    1/model.onnx        version 1
    2/model.onnx        version 2
  tiny/model.onnx       no version directories: served as version 1
  tinylm/               a generator, recognised with no model.toml: model.onnx with
    model.onnx          config.json and tokenizer.json beside it (Hugging Face Optimum's
    config.json         text-generation-with-past layout), at the top or in each
    tokenizer.json      numbered version directory
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tensord.errors import ModelLoadError
from tensord.registry.generator_config import GeneratorConfig
from tensord.registry.model_config import ModelConfig, ModelKind, read_model_config

# Beside the model file, these make a directory a generator (tensord.generate.model_dir).
GENERATOR_MARKERS = ("config.json", "tokenizer.json")

Fingerprint = tuple[tuple[str, int, int, int], ...]


def fingerprint(directory: Path) -> Fingerprint:
    """What a reload compares to tell whether a version's files changed.

    Each regular file under `directory` (model.toml aside: its settings are compared as
    settings) with its size, modification time and inode, so an edited file, a copied-over
    file and a file replaced by rename all count as changes. Stat only: no file is read.
    """
    entries = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if rel == "model.toml":
            continue
        try:
            st = path.stat()
        except OSError:
            continue  # vanished while scanning: the next reload sees the new state
        if path.is_file():
            entries.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(entries)


@dataclass(slots=True, frozen=True)
class VersionSource:
    """One model version found on disk, or the reason it cannot be served."""

    name: str
    version: int
    path: Path
    config: ModelConfig
    error: str = ""
    fingerprint: Fingerprint = field(default=(), compare=False)
    """Every file of the version: (relative path, size, mtime_ns, inode); see fingerprint()."""

    @property
    def kind(self) -> ModelKind:
        """ "generator" or "predict"; the scan resolves a detected kind into the config."""
        return self.config.kind or "predict"

    @property
    def directory(self) -> Path:
        """The version's directory (a generator's files sit beside its model file)."""
        return self.path.parent


def scan_repository(root: Path) -> list[VersionSource]:
    """Every model version under `root`, sorted by name then version.

    A broken model directory yields entries that carry its error, so it is reported
    as FAILED while the others load.
    """
    if not root.is_dir():
        raise ModelLoadError(f"model repository {root} is not a directory")
    found: list[VersionSource] = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found.extend(_scan_model(model_dir))
    return found


def _scan_model(model_dir: Path) -> list[VersionSource]:
    try:
        config = read_model_config(model_dir)
    except ModelLoadError as exc:
        return [VersionSource(model_dir.name, 1, model_dir, ModelConfig(), str(exc))]
    name = config.name or model_dir.name
    on_disk = {int(p.name): p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()}
    if not on_disk and (model_dir / config.model_file).exists():
        on_disk = {1: model_dir}
    config = _resolve_kind(config, on_disk)
    wanted = config.versions or sorted(on_disk)
    if not wanted:
        reason = (
            f"{model_dir}: no version directories (1/, 2/, ...) holding {config.model_file}, "
            f"and no {config.model_file} beside model.toml"
        )
        return [VersionSource(name, 1, model_dir, config, reason)]
    sources = []
    for version in wanted:
        directory = on_disk.get(version)
        if directory is None:
            missing = model_dir / str(version)
            reason = (
                f"{model_dir}: model.toml lists version {version}, but {missing} does not exist"
            )
            sources.append(VersionSource(name, version, model_dir / str(version), config, reason))
            continue
        path = directory / config.model_file
        error = "" if path.is_file() else f"{path} does not exist"
        if not error and config.kind == "generator":
            error = _generator_problem(directory, config.model_file)
        sources.append(VersionSource(name, version, path, config, error, fingerprint(directory)))
    return sources


def _holds_generator(directory: Path, model_file: str) -> bool:
    return all((directory / n).is_file() for n in (model_file, *GENERATOR_MARKERS))


def _resolve_kind(config: ModelConfig, on_disk: dict[int, Path]) -> ModelConfig:
    """The config with its kind decided and, for a generator, its [generator] defaults."""
    kind = config.kind
    if kind is None:
        detected = any(_holds_generator(d, config.model_file) for d in on_disk.values())
        kind = "generator" if detected or config.generator is not None else "predict"
    if kind == "predict":
        return config.model_copy(update={"kind": kind})
    return config.model_copy(
        update={"kind": kind, "generator": config.generator or GeneratorConfig()}
    )


def _generator_problem(directory: Path, model_file: str) -> str:
    missing = [n for n in GENERATOR_MARKERS if not (directory / n).is_file()]
    if not missing:
        return ""
    return (
        f"{directory}: a generator needs {' and '.join(GENERATOR_MARKERS)} beside "
        f"{model_file}; {', '.join(missing)} is missing"
    )
