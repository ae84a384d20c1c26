"""Whether the daemon should say SERVING: `[server] ready_when` applied to the models' states.

A model serves while one of its versions is READY (a request for version 0 then gets an
answer), as its own `tensord.model.<name>` health service says. A model whose versions are
all UNLOADING is being removed by a reload and no longer counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tensord.config import ReadyWhen
from tensord.registry.version import ModelState, ModelVersion

_NAMED = 5
"""Models named in a reason, at most (a repository may hold hundreds)."""


@dataclass(slots=True, frozen=True)
class Readiness:
    """The verdict of the readiness policy, and why when it is "not ready"."""

    ready: bool
    reason: str = ""
    """Why health is NOT_SERVING (for the log and systemd's STATUS=; it names models, so it
    is never sent to callers); empty when ready."""


def judge(policy: ReadyWhen, versions: Iterable[ModelVersion]) -> Readiness:
    """Apply `policy` to every model version the registry holds."""
    if policy == "always":
        return Readiness(True)
    models: dict[str, list[ModelVersion]] = {}
    for mv in versions:
        models.setdefault(mv.name, []).append(mv)
    models = {
        name: found
        for name, found in models.items()
        if any(mv.state is not ModelState.UNLOADING for mv in found)
    }
    serving = {name for name, found in models.items() if _serves(found)}
    if policy == "all_models":
        missing = sorted(set(models) - serving)
        if missing:
            reason = f"{_models(missing, models)} not READY (ready_when = all_models)"
            return Readiness(False, reason)
    required = sorted(
        name
        for name, found in models.items()
        if name not in serving and any(mv.config.required for mv in found)
    )
    if required:
        return Readiness(False, f"required {_models(required, models)} not READY")
    if not serving:
        if not models:
            return Readiness(False, "the model repository holds no model")
        return Readiness(False, f"no model is READY: {_counts(models)}")
    return Readiness(True)


def _serves(versions: list[ModelVersion]) -> bool:
    return any(mv.state is ModelState.READY for mv in versions)


def _models(names: list[str], models: dict[str, list[ModelVersion]]) -> str:
    """ "model 'a' (FAILED) is", "models 'a' (FAILED), 'b' (LOADING) and 3 more are"."""
    shown = [f"{name!r} ({_state(models[name])})" for name in names[:_NAMED]]
    more = len(names) - len(shown)
    listed = ", ".join(shown) + (f" and {more} more" if more else "")
    return f"model {listed} is" if len(names) == 1 else f"models {listed} are"


def _state(versions: list[ModelVersion]) -> str:
    """A model's state, from its least settled version: LOADING, then FAILED."""
    states = {mv.state for mv in versions}
    for state in (ModelState.LOADING, ModelState.FAILED, ModelState.UNLOADING):
        if state in states:
            return state.name
    return ModelState.READY.name


def _counts(models: dict[str, list[ModelVersion]]) -> str:
    """ "3 FAILED, 1 LOADING": how many models are in each state."""
    counts: dict[str, int] = {}
    for versions in models.values():
        state = _state(versions)
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
