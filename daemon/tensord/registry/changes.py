"""What a reload must do: compare the versions on disk with the versions being served."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tensord.modelconfig.model import ModelConfig
from tensord.registry.repository import VersionSource
from tensord.registry.version import ModelState, ModelVersion


@dataclass(slots=True)
class ReloadPlan:
    """Versions to load for the first time, to load again, and to unload."""

    added: list[VersionSource] = field(default_factory=list)
    changed: list[tuple[VersionSource, ModelVersion]] = field(default_factory=list)
    removed: list[ModelVersion] = field(default_factory=list)
    kept: list[tuple[ModelVersion, str]] = field(default_factory=list)
    """Served versions of a directory that could not be scanned as a whole (its model.toml
    does not read, say), with the reason: they serve on as they are."""
    retagged: list[tuple[VersionSource, ModelVersion]] = field(default_factory=list)
    """Unchanged versions whose model.toml changed only in keys applied in place
    (LIVE_MODEL_KEYS): the reload gives them the new settings without loading them."""
    unchanged: int = 0


@dataclass(slots=True)
class RepositoryChanges:
    """What a reload did, as "name vN" labels."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    """New or changed versions that did not load (a changed one keeps its old version),
    and the versions kept because their directory could not be scanned."""
    unchanged: int = 0


LIVE_MODEL_KEYS = ("required",)
"""model.toml keys that say how the daemon judges a model, not how it loads or runs it: a
change to them alone does not load the model again."""


def label(name: str, version: int) -> str:
    """ "mlp v2"."""
    return f"{name} v{version}"


def needs_reload(src: VersionSource, entry: ModelVersion) -> bool:
    """A version is loaded again when it failed before or anything about it differs."""

    return (
        entry.state is ModelState.FAILED
        or bool(src.error)
        or src.path != entry.path
        or _loaded_settings(src.config, entry.config) != entry.config
        or src.fingerprint != entry.fingerprint
    )


def _loaded_settings(new: ModelConfig, running: ModelConfig) -> ModelConfig:
    """`new` with the running values of LIVE_MODEL_KEYS: what loading the version uses."""
    return new.model_copy(update={key: getattr(running, key) for key in LIVE_MODEL_KEYS})


def plan_reload(
    served: Mapping[str, Mapping[int, ModelVersion]], sources: Iterable[VersionSource]
) -> ReloadPlan:
    """Sort every version on disk and every served version into the plan.

    A directory that could not be scanned as a whole (a whole-model entry) says nothing of
    which versions it holds: the versions it serves are kept, under their served names,
    while one of them is READY; otherwise its entry replaces them like any failed version.
    """

    sources = list(sources)
    broken = {src.model_dir: src for src in sources if src.whole_model}
    plan = ReloadPlan()
    kept = _keep_unscannable(served, broken, plan)
    seen = set(kept)
    for src in sources:
        if src.whole_model and src.model_dir not in broken:
            continue  # its served versions are kept
        src = _unless_claimed(src, kept)
        seen.add((src.name, src.version))
        _place(plan, src, served.get(src.name, {}).get(src.version))
    for name, versions in served.items():
        for version, entry in versions.items():
            if (name, version) not in seen:
                plan.removed.append(entry)
    return plan


def _keep_unscannable(
    served: Mapping[str, Mapping[int, ModelVersion]],
    broken: dict[Path | None, VersionSource],
    plan: ReloadPlan,
) -> dict[tuple[str, int], Path | None]:
    """Keep the served versions of each directory in `broken` while one of them is READY:
    they go into plan.kept and their directory leaves `broken`. Returns the directory of
    each (name, version) kept."""
    by_dir: dict[Path | None, list[ModelVersion]] = {}
    for versions in served.values():
        for mv in versions.values():
            if mv.model_dir in broken:
                by_dir.setdefault(mv.model_dir, []).append(mv)
    kept: dict[tuple[str, int], Path | None] = {}
    for directory, entries in by_dir.items():
        if any(mv.state is ModelState.READY for mv in entries):
            reason = broken.pop(directory).error
            plan.kept.extend((mv, reason) for mv in entries)
            kept.update(((mv.name, mv.version), directory) for mv in entries)
    return kept


def _unless_claimed(
    src: VersionSource, kept: Mapping[tuple[str, int], Path | None]
) -> VersionSource:
    """`src`, failed when another directory's kept version goes by its name and version."""
    if (src.name, src.version) not in kept:
        return src
    owner = kept[(src.name, src.version)]
    return replace(
        src,
        error=f"model name {src.name!r} is also served from {owner}, kept while its "
        "directory cannot be scanned; give each its own name",
    )


def _place(plan: ReloadPlan, src: VersionSource, entry: ModelVersion | None) -> None:
    """Sort a version on disk by the version of that name served now (`entry`)."""
    if entry is None:
        plan.added.append(src)
    elif needs_reload(src, entry):
        plan.changed.append((src, entry))
    else:
        plan.unchanged += 1
        if src.config != entry.config:
            plan.retagged.append((src, entry))
