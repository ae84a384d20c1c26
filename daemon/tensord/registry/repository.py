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

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from tensord.errors import ModelLoadError
from tensord.generate.model.genai_config import builder_model_file
from tensord.modelconfig.embedding import EmbeddingConfig
from tensord.modelconfig.generator import GeneratorConfig
from tensord.modelconfig.model import (
    MODEL_TOML,
    ModelConfig,
    ModelKind,
    embedding_key_problems,
    generator_key_problems,
    read_model_config,
)
from tensord.registry.layout import (
    SkippedEntry,
    is_version_name,
    model_file_hint,
    no_versions_hint,
    subdirectory_skips,
    top_level_skip,
)
from tensord.registry.version_files import (
    embedding_problem,
    generator_problem,
    model_file_problem,
)

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
    model_dir: Path | None = field(default=None, compare=False)
    """The model's directory in the repository."""
    whole_model: bool = field(default=False, compare=False)
    """The model's directory could not be used as a whole (its model.toml does not read,
    say): this entry stands for every version of it, whose names and numbers are unknown.
    A reload keeps the versions of that directory it serves."""

    @property
    def kind(self) -> ModelKind:
        """ "generator" or "predict"; the scan resolves a detected kind into the config."""
        return self.config.kind or "predict"

    version_dir: Path | None = field(default=None, compare=False)
    """The version's directory, when it exists (its model file may be in a subdirectory
    of it: a sentence-transformers folder's onnx/model.onnx)."""

    @property
    def directory(self) -> Path:
        """The version's directory (a generator's files sit beside its model file)."""
        return self.version_dir if self.version_dir is not None else self.path.parent


@dataclass(slots=True)
class RepositoryScan:
    """What a scan found: the model versions, and the entries that are not served."""

    sources: list[VersionSource]
    """Every model version, sorted by name then version (see read_repository)."""
    skipped: list[SkippedEntry]
    """Entries that are no model or no version of one, with why (the registry logs each
    as `repository.skipped`; `tensord check-config` lists them)."""


def scan_repository(root: Path, follow_symlinks: bool = False) -> list[VersionSource]:
    """Every model version under `root`, sorted by name then version (read_repository's
    sources)."""
    return read_repository(root, follow_symlinks).sources


def read_repository(root: Path, follow_symlinks: bool = False) -> RepositoryScan:
    """Every model version under `root`, and every entry that is not one.

    A broken model directory yields entries that carry its error, so it is reported
    as FAILED while the others load; so do two directories that claim the same name. A
    model file (or a generator's JSON file) that symlinks lead outside its model's
    directory fails too, unless `follow_symlinks` (the config's follow_model_symlinks).
    Files at the top, hidden entries and directories with nothing of a model in them are
    skipped, as are subdirectories of a model that are not one of its versions.
    """
    if not root.is_dir():
        raise ModelLoadError(f"model repository {root} is not a directory")
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise ModelLoadError(f"model repository {root}: cannot list: {exc}") from None
    found: list[VersionSource] = []
    skipped: list[SkippedEntry] = []
    for path in entries:
        skip = top_level_skip(path)
        if skip is not None:
            skipped.append(skip)
            continue
        found.extend(_scan_model(path, follow_symlinks, skipped))
    found = _refuse_shared_names(found)
    return RepositoryScan(sorted(found, key=lambda src: (src.name, src.version)), skipped)


def _scan_model(
    model_dir: Path, follow_symlinks: bool, skipped: list[SkippedEntry]
) -> list[VersionSource]:
    """The versions of one model directory; one whole-model entry if it cannot be used.
    Its subdirectories that serve no version go to `skipped`."""
    toml = model_dir / MODEL_TOML
    if toml.is_symlink():  # its text would be read, and a bad line quoted in the reason
        try:
            real = toml.resolve()
        except (OSError, RuntimeError):  # a loop of symlinks
            problem = f"{toml} is a symlink that leads nowhere (a loop)"
            return [_whole_model_failure(model_dir, model_dir.name, ModelConfig(), problem)]
        if not real.is_relative_to(model_dir.resolve()):
            problem = (
                f"{toml} leads to {str(real)!r}, outside the model's directory: a model.toml "
                "is the model's own file (symlinks to it are followed only inside the directory)"
            )
            return [_whole_model_failure(model_dir, model_dir.name, ModelConfig(), problem)]
    try:
        config = read_model_config(model_dir)
    except ModelLoadError as exc:
        return [_whole_model_failure(model_dir, model_dir.name, ModelConfig(), str(exc))]
    name = config.name or model_dir.name
    try:
        sources = _scan_versions(model_dir, name, config, follow_symlinks)
    except OSError as exc:
        reason = f"{model_dir}: cannot read: {exc}"
        return [_whole_model_failure(model_dir, name, config, reason)]
    if any(src.kind == "embedding" and src.directory == model_dir for src in sources):
        return sources  # a folder served as it is: its subdirectories are its own modules
    served = {src.directory for src in sources} | {model_dir / str(s.version) for s in sources}
    with contextlib.suppress(OSError):  # what cannot be read, the versions' reasons say
        skipped += subdirectory_skips(model_dir, served, config.versions)
    return sources


def _whole_model_failure(
    model_dir: Path, name: str, config: ModelConfig, reason: str
) -> VersionSource:
    return VersionSource(name, 1, model_dir, config, reason, (), model_dir, whole_model=True)


def _scan_versions(
    model_dir: Path, name: str, config: ModelConfig, follow_symlinks: bool
) -> list[VersionSource]:
    on_disk, refused = _version_dirs(model_dir)
    top = _in_directory(config, model_dir)
    if not on_disk and not refused and (model_dir / top.model_file).exists():
        on_disk = {1: model_dir}
    config = _resolve_kind(config, on_disk)
    if config.kind in ("generator", "embedding"):
        problems = generator_key_problems if config.kind == "generator" else embedding_key_problems
        wrong = problems(config)
        if wrong:
            reason = f"{model_dir / MODEL_TOML}: {'; '.join(wrong)}"
            return [_whole_model_failure(model_dir, name, config, reason)]
    wanted = config.versions or sorted({*on_disk, *refused})
    if not wanted:
        reason = (
            f"{model_dir}: no version directories (1/, 2/, ...) holding {config.model_file}, "
            f"and no {config.model_file} beside model.toml"
        ) + no_versions_hint(model_dir, config.model_file)
        return [VersionSource(name, 1, model_dir, config, reason, (), model_dir)]
    sources = []
    for version in wanted:
        directory = on_disk.get(version)
        if directory is None:
            reason = refused.get(version) or (
                f"{model_dir}: model.toml lists version {version}, but "
                f"{model_dir / str(version)} does not exist"
            )
            where = model_dir / str(version)
            sources.append(VersionSource(name, version, where, config, reason, (), model_dir))
            continue
        here = _in_directory(config, directory)
        path = directory / here.model_file
        error = model_file_problem(path, model_dir, follow_symlinks)
        if error and not path.exists() and not path.is_symlink():
            error += model_file_hint(directory, here.model_file, model_dir)
        if not error and here.kind == "generator":
            error = generator_problem(directory, here.model_file, model_dir, follow_symlinks)
        if not error and here.kind == "embedding":
            error = embedding_problem(directory, model_dir, follow_symlinks)
        sources.append(
            VersionSource(
                name,
                version,
                path,
                here,
                error,
                fingerprint(directory),
                model_dir,
                version_dir=directory,
            )
        )
    return sources


def _version_dirs(model_dir: Path) -> tuple[dict[int, Path], dict[int, str]]:
    """Numbered subdirectories by version, and the numbers that cannot be served, with why.

    Only ASCII digits count ("²" is a digit to str.isdigit, not a version). Version 0 is
    refused (a request's version 0 means "the newest ready"), and so are two directories
    with the same number ("01" and "1").
    """
    numbered: dict[int, list[str]] = {}
    for path in sorted(model_dir.iterdir()):
        if path.is_dir() and is_version_name(path.name):
            numbered.setdefault(int(path.name), []).append(path.name)
    on_disk, refused = {}, {}
    for version, names in numbered.items():
        shown = " and ".join(f"{n}/" for n in names)
        if version == 0:
            refused[0] = (
                f"{model_dir}: {shown} is not served: versions are numbered from 1 "
                "(version 0 in a request means the newest ready version); rename it"
            )
        elif len(names) > 1:
            refused[version] = f"{model_dir}: {shown} are both version {version}; keep one of them"
        else:
            on_disk[version] = model_dir / names[0]
    return on_disk, refused


def _refuse_shared_names(found: list[VersionSource]) -> list[VersionSource]:
    """Mark every version of a name that two directories claim as failed, naming both;
    one entry per (name, version) remains."""
    owners: dict[str, list[Path]] = {}
    for src in found:
        dirs = owners.setdefault(src.name, [])
        if src.model_dir is not None and src.model_dir not in dirs:
            dirs.append(src.model_dir)
    kept: dict[tuple[str, int], VersionSource] = {}
    # A whole-model entry goes first: a reload keeps what its directory serves.
    for src in sorted(found, key=lambda src: not src.whole_model):
        dirs = owners[src.name]
        if len(dirs) > 1:
            shown = " and ".join(str(d) for d in dirs)
            reason = (
                f"model name {src.name!r} is claimed by {len(dirs)} directories: {shown}; "
                f"give each its own name (name = ... in {MODEL_TOML})"
            )
            src = replace(src, error=f"{reason}; {src.error}" if src.error else reason)
        kept.setdefault((src.name, src.version), src)
    return list(kept.values())


def _in_directory(config: ModelConfig, directory: Path) -> ModelConfig:
    """The config as it applies to one version directory: a model-builder folder names its
    decoder in genai_config.json (Microsoft's Phi-3 folders use long file names, and a CPU
    and a CUDA build differ), and that file is served unless model.toml sets model_file."""
    if "model_file" in config.model_fields_set:
        return config
    name = builder_model_file(directory)
    if name is None and config.kind in (None, "embedding"):
        from tensord.embedding.folder import embedding_model_file

        name = embedding_model_file(directory)
    if name is None or name == config.model_file:
        return config
    return config.model_copy(update={"model_file": name})


def _resolve_kind(config: ModelConfig, on_disk: dict[int, Path]) -> ModelConfig:
    """The config with its kind decided and, for a generator, its [generator] defaults."""
    kind = config.kind
    if kind is None:
        # Here, not at the top: these bring onnx, which a frontend process importing the
        # registry's types never needs.
        from tensord.embedding.folder import is_embedding_dir
        from tensord.generate.model.model_dir import is_generator_dir

        if config.embedding is not None or any(
            is_embedding_dir(d, _in_directory(config, d).model_file) for d in on_disk.values()
        ):
            kind = "embedding"
        elif config.generator is not None or any(
            is_generator_dir(d, _in_directory(config, d).model_file) for d in on_disk.values()
        ):
            kind = "generator"
        else:
            kind = "predict"
    if kind == "predict":
        return config.model_copy(update={"kind": kind})
    if kind == "embedding":
        update: dict[str, object] = {
            "kind": kind,
            "embedding": config.embedding or EmbeddingConfig(),
        }
        if "intra_op_threads" not in config.model_fields_set:
            # One run at a time on every core: the padded batches of an encoder are the
            # kind of work ONNX Runtime's threads share well (benchmarks/README.md).
            update["intra_op_threads"] = 0
        return config.model_copy(update=update)
    return config.model_copy(
        update={"kind": kind, "generator": config.generator or GeneratorConfig()}
    )
