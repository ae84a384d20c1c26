"""Reload on SIGHUP: read the config again, let each component re-read its files, rescan models.

Order: the config file is read and validated first; if it is bad, nothing changes and the
reason is logged. Settings the running process cannot change (the listen address, say) keep
their old values and are logged as ignored until a restart. Then every reload hook runs with
the new config (components that keep files of their own, such as certificates or token
lists, register one), then the model repository is rescanned.

A hook either applies its new state entirely or raises and keeps its old state; a failing
hook is logged and does not stop the others or the model reload.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from tensord.config import TensordConfig
from tensord.errors import ConfigError, ModelLoadError
from tensord.registry.changes import RepositoryChanges
from tensord.registry.registry import ModelRegistry

log = structlog.get_logger("tensord.reload")

ReloadHook = Callable[[TensordConfig], Awaitable[None] | None]
ConfigLoader = Callable[[], TensordConfig]

# Dotted keys that are read once at start. A reload logs a change to them and keeps the
# running value. (Logging is configured once: structlog caches its loggers.)
RESTART_ONLY_KEYS = (
    "server.listen",
    "server.max_receive_message_bytes",
    "server.max_send_message_bytes",
    "server.log_format",
    "server.log_level",
    "server.cuda_device",
    "server.event_loop",
    "cache_directory",
)


@dataclass(slots=True)
class ReloadResult:
    """What one reload did."""

    config_error: str = ""
    """Why the config was not taken (then nothing else changed)."""
    ignored: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Restart-only keys that changed: key -> (running value, value in the file)."""
    hook_errors: list[str] = field(default_factory=list)
    models: RepositoryChanges | None = None
    models_error: str = ""
    """Why the repository could not be scanned (the served models stayed as they were)."""

    @property
    def ok(self) -> bool:
        """Everything that was asked for was applied."""
        return not (self.config_error or self.hook_errors or self.models_error) and not (
            self.models is not None and self.models.failed
        )


def _get(config: TensordConfig, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part, None)
    return value


def keep_restart_only(
    running: TensordConfig, new: TensordConfig, keys: tuple[str, ...]
) -> tuple[TensordConfig, dict[str, tuple[Any, Any]]]:
    """`new` with the running values of `keys`, and which of those keys differ."""
    ignored = {}
    merged = new.model_copy(deep=True)
    for key in keys:
        old_value, new_value = _get(running, key), _get(new, key)
        if old_value == new_value:
            continue
        ignored[key] = (old_value, new_value)
        *parents, leaf = key.split(".")
        target: Any = merged
        for part in parents:
            target = getattr(target, part)
        setattr(target, leaf, old_value)
    return merged, ignored


class Reloader:
    """Owns the reload hooks and runs one reload at a time."""

    def __init__(self, registry: ModelRegistry, load_config: ConfigLoader | None) -> None:
        self.registry = registry
        self._load_config = load_config
        self._hooks: list[ReloadHook] = []
        self.restart_only: tuple[str, ...] = RESTART_ONLY_KEYS

    def add_hook(self, hook: ReloadHook) -> None:
        """Call `hook(new_config)` (plain or async) on every reload, in registration order."""
        self._hooks.append(hook)

    async def run(self, running: TensordConfig) -> tuple[TensordConfig, ReloadResult]:
        """One reload; returns the config now in force and what happened."""
        result = ReloadResult()
        config = running
        if self._load_config is not None:
            try:
                fresh = await asyncio.to_thread(self._load_config)
            except ConfigError as exc:
                result.config_error = str(exc)
                log.error("reload.config_rejected", error=str(exc), kept="the running config")
                return running, result
            config, result.ignored = keep_restart_only(running, fresh, self.restart_only)
            for key, (old, new) in result.ignored.items():
                log.warning(
                    "reload.ignored_until_restart", key=key, running=str(old), file=str(new)
                )
            _apply_live_settings(config)
        for hook in self._hooks:
            await self._run_hook(hook, config, result)
        try:
            result.models = await self.registry.reload(config.model_repository)
        except ModelLoadError as exc:
            result.models_error = str(exc)
            log.error("reload.repository_failed", error=str(exc), kept="the served models")
        return config, result

    @staticmethod
    async def _run_hook(hook: ReloadHook, config: TensordConfig, result: ReloadResult) -> None:
        name = getattr(hook, "__qualname__", repr(hook))
        try:
            outcome = hook(config)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as exc:
            result.hook_errors.append(f"{name}: {exc}")
            log.error("reload.hook_failed", hook=name, error=str(exc), exc_info=exc)


def _apply_live_settings(config: TensordConfig) -> None:
    """Settings that take effect without a restart (others are read where they are used)."""
    sys.setswitchinterval(config.server.switch_interval_us / 1e6)
