"""The daemon's configuration: a TOML file, overridden by TENSORD_* variables and CLI flags.

Every field has a documented default; a bad value fails at start with the field's path.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tensord.errors import ConfigError

ENV_PREFIX = "TENSORD_"


class ServerSettings(BaseModel):
    """The `[server]` table."""

    model_config = ConfigDict(extra="forbid")

    listen: str = "127.0.0.1:50051"
    """Address to listen on, HOST:PORT (IPv6 as [::1]:PORT); port 0 picks a free port."""
    max_receive_message_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Largest request message accepted; larger ones get RESOURCE_EXHAUSTED."""
    max_send_message_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Largest response message sent."""
    drain_grace_seconds: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long in-flight calls get to finish before they are cancelled."""
    log_format: Literal["auto", "json", "console"] = "auto"
    """`json` lines, `console` key=value, or `auto`: console on a terminal, else JSON."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged. Per-request access lines are logged at debug."""
    switch_interval_us: int = Field(default=200, ge=50, le=100_000)
    """How often Python offers the GIL to another thread (sys.setswitchinterval). The event
    loop and the model lanes take turns on it; Python's 5000 us default makes completions
    wait behind the loop (measured: ~20% fewer Predicts/s at 32 in flight)."""
    cuda_device: int = Field(default=0, ge=0)
    """The CUDA device (as numbered after CUDA_VISIBLE_DEVICES) that GPU models run on."""

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"expected HOST:PORT such as 127.0.0.1:50051, got {value!r}")
        return value


class TensordConfig(BaseModel):
    """The whole configuration file."""

    model_config = ConfigDict(extra="forbid")

    server: ServerSettings = ServerSettings()
    """Network, limits and logging."""
    model_repository: Path = Path("models")
    """Directory with one subdirectory per model (relative paths are from the config file)."""
    cache_directory: Path = Path("cache")
    """Where TensorRT engines and compiled kernels are cached (relative: as above)."""


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TensordConfig:
    """Read the file (if any), apply TENSORD_* variables, then explicit overrides.

    Override keys are dotted paths such as ``server.listen`` or ``model_repository``.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"config {path}: cannot read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {path}: not valid TOML: {exc}") from None
        # A relative directory in the file is relative to the file; from a flag or
        # variable, to the working directory.
        for key in ("model_repository", "cache_directory"):
            value = data.get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                data[key] = str(path.parent / value)
    for key, value in _env_overrides(os.environ if env is None else env).items():
        _set_dotted(data, key, value)
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    try:
        config = TensordConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path or "(defaults)"))) from None
    config.model_repository = config.model_repository.resolve()
    config.cache_directory = config.cache_directory.resolve()
    return config


def env_keys() -> dict[str, str]:
    """Every TENSORD_* variable the daemon reads, mapped to the setting it overrides.

    TENSORD_MODEL_REPOSITORY -> model_repository, TENSORD_SERVER_LISTEN -> server.listen.
    """
    keys = {
        f"{ENV_PREFIX}SERVER_{sub.upper()}": f"server.{sub}" for sub in ServerSettings.model_fields
    }
    for name in TensordConfig.model_fields:
        if name != "server":
            keys[f"{ENV_PREFIX}{name.upper()}"] = name
    return keys


def _env_overrides(env: Mapping[str, str]) -> dict[str, str]:
    keys = env_keys()
    return {keys[k]: v for k, v in env.items() if k in keys}


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{part}: expected a table, got {child!r}")
        node = child
    node[leaf] = value


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: the field's dotted path, what was wrong, what was given."""
    lines = [f"{source}: {exc.error_count()} invalid setting(s)"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see the README's configuration reference)"
        given = err.get("input")
        suffix = "" if err["type"] in ("missing", "extra_forbidden") else f" (got {given!r})"
        lines.append(f"  {loc}: {msg}{suffix}")
    return "\n".join(lines)
