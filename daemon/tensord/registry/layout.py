"""What a model repository holds besides models, and hints for a model file that is not
where model.toml says: the scan reports every entry it does not serve, with the reason, so
that a file in the wrong place is never ignored without a word."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tensord.modelconfig.model import MODEL_TOML

MODEL_SUFFIX = ".onnx"
LOST_AND_FOUND = "lost+found"
"""What fsck keeps at the root of an ext filesystem (a repository on its own volume)."""


@dataclass(slots=True, frozen=True)
class SkippedEntry:
    """An entry of the repository that is not served (a file, a directory), and why."""

    path: Path
    reason: str
    notable: bool = True
    """Worth a warning: it looks like a model, or a part of one, in the wrong place. Hidden
    entries and lost+found are not."""


def is_version_name(name: str) -> bool:
    """A version directory's name: ASCII digits ("²" is a digit to str.isdigit)."""
    return name.isascii() and name.isdecimal()


def top_level_skip(path: Path) -> SkippedEntry | None:
    """Why an entry at the top of the repository is not a model directory; None when it
    may be one (a directory with a model.toml, an .onnx file or a version directory)."""
    name = path.name
    if name.startswith("."):
        return SkippedEntry(path, "hidden (its name starts with a dot)", notable=False)
    if not path.is_dir():
        if not path.exists():
            return SkippedEntry(path, "a symlink that leads nowhere")
        if name.endswith(MODEL_SUFFIX):
            stem = name.removesuffix(MODEL_SUFFIX)
            return SkippedEntry(
                path,
                "a model file at the top of the repository, where each model is a directory: "
                f"move it to {stem}/1/model.onnx (served as model {stem!r}, version 1)",
            )
        return SkippedEntry(
            path, "a file at the top of the repository, where each model is a directory"
        )
    if name == LOST_AND_FOUND:
        return SkippedEntry(path, "the filesystem's lost+found directory", notable=False)
    try:
        if _looks_like_model(path):
            return None
    except OSError:
        return None  # the model's scan says why it cannot be read
    return SkippedEntry(
        path,
        f"a directory with no {MODEL_TOML}, no {MODEL_SUFFIX} file and no version directory "
        "(a model is NAME/1/model.onnx, NAME/2/model.onnx, ... or NAME/model.onnx)",
    )


def _looks_like_model(directory: Path) -> bool:
    """A model.toml, a version directory, or an .onnx file at the top or one level down."""
    if (directory / MODEL_TOML).exists() or (directory / MODEL_TOML).is_symlink():
        return True
    for path in directory.iterdir():
        if path.name.endswith(MODEL_SUFFIX):
            return True
        if (
            path.is_dir()
            and not path.name.startswith(".")
            and (is_version_name(path.name) or other_model_files(path, ""))
        ):
            return True
    return False


def subdirectory_skips(model_dir: Path, served: set[Path], listed: list[int]) -> list[SkippedEntry]:
    """The subdirectories of a model directory that serve no version: hidden, not
    numbered, or numbered but left out of model.toml's `versions` (`listed`). `served` are
    the directories that hold a version served (or failed with its reason)."""
    skipped = []
    for path in sorted(model_dir.iterdir()):
        if not path.is_dir() or path in served:
            continue
        name = path.name
        if name.startswith("."):
            skipped.append(SkippedEntry(path, "hidden (its name starts with a dot)", False))
        elif not is_version_name(name):
            reason = (
                "not a version directory: versions are directories named with digits (1/, 2/, ...)"
            )
            skipped.append(SkippedEntry(path, reason))
        elif listed and int(name) not in listed:
            reason = f"version {int(name)} is not in {MODEL_TOML}'s versions {listed}"
            skipped.append(SkippedEntry(path, reason))
    return skipped


def other_model_files(directory: Path, model_file: str) -> list[str]:
    """The .onnx files in `directory` other than `model_file`, by name."""
    try:
        return sorted(
            p.name
            for p in directory.iterdir()
            if p.name.endswith(MODEL_SUFFIX) and p.name != model_file and p.is_file()
        )
    except OSError:
        return []


def model_file_hint(directory: Path, model_file: str, model_dir: Path) -> str:
    """When `directory` lacks `model_file` but holds other .onnx files: which, and the
    model.toml line that serves one ("" when it holds none)."""
    found = other_model_files(directory, model_file)
    if not found:
        return ""
    toml = model_dir / MODEL_TOML
    where = "the model's directory" if directory == model_dir else f"{directory.name}/"
    if len(found) == 1:
        return f'; {where} holds {found[0]}: set model_file = "{found[0]}" in {toml}'
    names = ", ".join(found)
    return (
        f"; {where} holds {names}: set model_file to the one to serve in {toml} "
        f'(model_file = "{found[0]}")'
    )


def no_versions_hint(model_dir: Path, model_file: str) -> str:
    """For a model directory with no version directory and no model file: the .onnx files
    at its top, and the subdirectories that hold one but are not numbered."""
    hint = model_file_hint(model_dir, model_file, model_dir)
    try:
        named = sorted(
            p.name
            for p in model_dir.iterdir()
            if p.is_dir() and not is_version_name(p.name) and not p.name.startswith(".")
            if (p / model_file).exists() or other_model_files(p, model_file)
        )
    except OSError:
        named = []
    if named:
        shown = ", ".join(f"{n}/" for n in named)
        verb = "is not a version directory" if len(named) == 1 else "are not version directories"
        hint += f"; {shown} {verb}: name them 1/, 2/, ..."
    return hint
