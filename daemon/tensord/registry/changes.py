"""What a reload must do: compare the versions on disk with the versions being served."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tensord.registry.repository import VersionSource

if TYPE_CHECKING:
    from tensord.registry.registry import ModelVersion


@dataclass(slots=True)
class ReloadPlan:
    """Versions to load for the first time, to load again, and to unload."""

    added: list[VersionSource] = field(default_factory=list)
    changed: list[tuple[VersionSource, ModelVersion]] = field(default_factory=list)
    removed: list[ModelVersion] = field(default_factory=list)
    unchanged: int = 0


@dataclass(slots=True)
class RepositoryChanges:
    """What a reload did, as "name vN" labels."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    """New or changed versions that did not load (a changed one keeps its old version)."""
    unchanged: int = 0


def label(name: str, version: int) -> str:
    """ "mlp v2"."""
    return f"{name} v{version}"


def needs_reload(src: VersionSource, entry: ModelVersion) -> bool:
    """A version is loaded again when it failed before or anything about it differs."""
    from tensord.registry.registry import ModelState

    return (
        entry.state is ModelState.FAILED
        or bool(src.error)
        or src.path != entry.path
        or src.config != entry.config
        or src.fingerprint != entry.fingerprint
    )


def plan_reload(
    served: Mapping[str, Mapping[int, ModelVersion]], sources: Iterable[VersionSource]
) -> ReloadPlan:
    """Sort every version on disk and every served version into the plan."""
    plan = ReloadPlan()
    seen: set[tuple[str, int]] = set()
    for src in sources:
        seen.add((src.name, src.version))
        entry = served.get(src.name, {}).get(src.version)
        if entry is None:
            plan.added.append(src)
        elif needs_reload(src, entry):
            plan.changed.append((src, entry))
        else:
            plan.unchanged += 1
    for name, versions in served.items():
        for version, entry in versions.items():
            if (name, version) not in seen:
                plan.removed.append(entry)
    return plan
