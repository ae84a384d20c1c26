"""Reload on SIGHUP: read the config again, let each component re-read its files, rescan models.

One Reloader serves every process that reloads: the one-process daemon and each frontend
(TensordServer), the engine process (its models) and the supervisor (its own settings).

Order: the config file is read (on a worker thread) and validated first; if it is bad,
nothing changes and the reason is logged. Settings the running process cannot change (the
listen address, say) keep their old values and are logged as ignored until a restart. Then
every reload hook runs with the new config (components that keep files of their own, such
as certificates or token lists, register one), then the model repository is rescanned.

A hook either applies its new state entirely or raises and keeps its old state; a failing
hook is logged and does not stop the others or the model reload.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from tensord.config import TensordConfig
from tensord.dataplane import RepositoryChanges
from tensord.errors import ConfigError, ModelLoadError

log = structlog.get_logger("tensord.reload")

ReloadHook = Callable[[TensordConfig], Awaitable[None] | None]
ConfigLoader = Callable[[], TensordConfig]

# Dotted keys that are read once at start: the transport (address, message sizes, HTTP/2
# and keepalive options are fixed when the gRPC server is built), logging (structlog caches
# its loggers), the device and event loop, the caches, the Generate stream limit (its
# interceptor is built at start), the metrics endpoint, the OpenAI port (its routes are
# built at start) and the tracer. A reload logs a
# change to them and keeps the running value.
RESTART_ONLY_KEYS = (
    "server.listen",
    "server.max_receive_message_bytes",
    "server.max_send_message_bytes",
    "server.log_format",
    "server.log_level",
    "server.event_loop",
    "server.cuda_device",
    "server.frontends",
    "server.model_control",
    "server.load_models",
    "server.max_concurrent_streams",
    "server.keepalive_time_seconds",
    "server.keepalive_timeout_seconds",
    "server.keepalive_min_client_interval_seconds",
    "server.max_connection_age_seconds",
    "server.max_connection_age_grace_seconds",
    "cache_directory",
    "limits.max_generate_streams",
    "metrics.listen",
    "openai.listen",
    "openai.max_body_bytes",
    "tracing.enabled",
    "tracing.service_name",
    "tracing.otlp_endpoint",
    "tracing.sample_ratio",
)

# Dotted keys a reload applies: read where they are used from the config in force
# (model_repository, the drain settings), set by apply_live_settings, or handed to a reload
# hook (the server's limits and readiness policy; Security re-reads the TLS files and the
# token file with the [auth] settings). Every key is in exactly one of these two lists (a
# test checks it).
LIVE_KEYS = (
    "model_repository",
    "follow_model_symlinks",
    "server.drain_grace_seconds",
    "server.drain_delay_seconds",
    "server.switch_interval_us",
    "server.ready_when",
    "limits.max_prompt_tokens",
    "limits.max_tensors_per_request",
    "limits.max_request_fields",
    "limits.max_typed_integers",
    "limits.max_request_bytes_in_flight",
    "limits.receive_timeout_seconds",
    "tls.cert_file",
    "tls.key_file",
    "tls.client_ca_file",
    "auth.token_file",
    "auth.open_health",
    "auth.open_reflection",
    "auth.rate_per_second",
    "auth.burst",
)


def _tls_mode(config: TensordConfig) -> str:
    tls = config.tls
    if not tls.enabled:
        return "plaintext"
    return "mtls" if tls.client_ca_file is not None else "tls"


def _auth_mode(config: TensordConfig) -> str:
    return "tokens" if config.auth.enabled else "off"


# Tables whose files a reload re-reads, but which cannot be switched on or off (nor TLS
# between one-way and mutual) without a restart: the credentials and interceptors are
# chosen when the server is built. When the mode differs, the whole running table stays.
SWITCHED_TABLES: dict[str, Callable[[TensordConfig], str]] = {
    "tls": _tls_mode,
    "auth": _auth_mode,
}


@dataclass(slots=True)
class ReloadResult:
    """What one reload did."""

    config_error: str = ""
    """Why the config file was not taken (the running config stayed; the token file and the
    model repository were still read again)."""
    ignored: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Restart-only keys that changed: key -> (running value, value in the file); a table
    switched on or off appears as "tls" or "auth" -> (running mode, mode in the file)."""
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
    """`new` with the running values of `keys` (and of a table in SWITCHED_TABLES whose
    mode differs), and which of those differ."""
    ignored: dict[str, tuple[Any, Any]] = {}
    merged = new.model_copy(deep=True)
    for table, mode in SWITCHED_TABLES.items():
        old_mode, new_mode = mode(running), mode(new)
        if old_mode != new_mode:
            ignored[table] = (old_mode, new_mode)
            setattr(merged, table, getattr(running, table).model_copy(deep=True))
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


ModelReloader = Callable[[Path], Awaitable[RepositoryChanges]]


class Reloader:
    """Owns the reload hooks and runs one reload: the config file read off the event loop,
    restart-only keys kept at their running values, the live settings applied, each hook
    run, then the model repository rescanned (`reload_models`, where the process serves
    models)."""

    def __init__(
        self, load_config: ConfigLoader | None, reload_models: ModelReloader | None = None
    ) -> None:
        self._load_config = load_config
        self._reload_models = reload_models
        self._hooks: list[ReloadHook] = []
        self._lock = asyncio.Lock()
        self.restart_only: tuple[str, ...] = RESTART_ONLY_KEYS

    def add_hook(self, hook: ReloadHook) -> None:
        """Call `hook(new_config)` (plain or async) on every reload, in registration order."""
        self._hooks.append(hook)

    async def run(self, running: TensordConfig) -> tuple[TensordConfig, ReloadResult]:
        """One reload; returns the config now in force and what happened.

        It never raises (cancellation aside): whatever fails is logged and reported in the
        result, so the caller always finishes its notifications."""
        async with self._lock:  # one at a time: a second waits for the first
            return await self._run(running)

    async def _run(self, running: TensordConfig) -> tuple[TensordConfig, ReloadResult]:
        result = ReloadResult()
        config = running
        if self._load_config is not None:
            try:
                fresh = await asyncio.to_thread(self._load_config)
            except Exception as exc:
                # One bad file takes nothing else down: the running config stays, and the
                # token file and the model repository are read again all the same.
                error = str(exc) if isinstance(exc, ConfigError) else f"{exc!r}"
                result.config_error = error
                log.error("reload.config_rejected", error=error, kept="the running config")
            else:
                config, result.ignored = keep_restart_only(running, fresh, self.restart_only)
                for key, (old, new) in result.ignored.items():
                    log.warning(
                        "reload.ignored_until_restart", key=key, running=str(old), file=str(new)
                    )
                apply_live_settings(config)
        for hook in self._hooks:
            await self._run_hook(hook, config, result)
        if self._reload_models is not None:
            await self._rescan(config, result)
        return config, result

    async def _rescan(self, config: TensordConfig, result: ReloadResult) -> None:
        assert self._reload_models is not None
        try:
            result.models = await self._reload_models(config.model_repository)
        except Exception as exc:
            error = str(exc) if isinstance(exc, ModelLoadError) else f"unexpected: {exc!r}"
            result.models_error = error
            log.error(
                "reload.repository_failed",
                error=error,
                kept="the served models",
                exc_info=None if isinstance(exc, ModelLoadError) else exc,
            )

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


def apply_live_settings(config: TensordConfig) -> None:
    """Settings that take effect without a restart (others are read where they are used)."""
    sys.setswitchinterval(config.server.switch_interval_us / 1e6)
