"""The daemon's configuration: a TOML file, overridden by TENSORD_* variables and CLI flags.

Every field has a documented default; a bad value fails at start with the field's path.

The layers are pydantic-settings sources, applied in that order (later ones win): the file,
read by `TomlFileSource`; the environment, read by pydantic-settings' own
`EnvSettingsSource` from the naming in `TensordConfig.model_config` (prefix `TENSORD_`, one
`_` between a table and its key: TENSORD_SERVER_LISTEN is `server.listen`); the flags, an
`InitSettingsSource`. Three parts stay hand-written, because pydantic-settings cannot
express them:

- merging and validating the layers (`load_config`): BaseSettings merges its sources before
  it validates, so an error could not name the variable or flag its value came from, as
  tensord's messages do ("TENSORD_SERVER_LISTEN: 1 invalid setting(s)");
- reading the file: its TOML source skips a path that is missing or not a regular file
  (tensord refuses it, naming the file), parses without tensord's bounds on size and
  nesting (tensord.files.read_toml), and cannot make relative paths relative to the file;
- the flags themselves: argparse in tensord.cli, as pydantic-settings' CLI source would name
  every key as a flag (`--server.listen`), not the few documented short ones (`--listen`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from tensord.config_tables import (
    INT32_MAX,
    AuthSettings,
    LimitsSettings,
    MetricsSettings,
    OpenAISettings,
    Settings,
    TLSSettings,
    TracingSettings,
)
from tensord.errors import ConfigError
from tensord.files import read_toml

ENV_PREFIX = "TENSORD_"

MAX_DRAIN_SECONDS = 3600.0
"""Upper bound of drain_grace_seconds and drain_delay_seconds (an hour): a stop that
waits longer is a stop that hangs."""
MAX_TRANSPORT_SECONDS = 7 * 24 * 3600.0
"""Upper bound of the keepalive and connection-age durations (a week): gRPC takes them
as 32-bit milliseconds (at most about 24 days)."""

MAX_FRONTENDS = 64
"""Most gRPC frontend processes ([server] frontends)."""

ReadyWhen = Literal["any_model", "all_models", "always"]
"""The readiness policies of `[server] ready_when` (tensord.registry.readiness applies them)."""


class ServerSettings(Settings):
    """The `[server]` table."""

    # inf and nan never make sense for a duration, and would crash the gRPC server.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    listen: str = "127.0.0.1:50051"
    """Address to listen on, HOST:PORT (IPv6 as [::1]:PORT); port 0 picks a free port."""
    max_receive_message_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=INT32_MAX)
    """Largest request message accepted; larger ones get RESOURCE_EXHAUSTED (at most
    2147483647, what gRPC takes)."""
    max_send_message_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=INT32_MAX)
    """Largest response message sent (at most 2147483647)."""
    drain_grace_seconds: float = Field(default=30.0, ge=0, le=MAX_DRAIN_SECONDS)
    """On SIGTERM, how long in-flight calls get to finish before they are cancelled
    (at most 3600)."""
    drain_delay_seconds: float = Field(default=0.0, ge=0, le=MAX_DRAIN_SECONDS)
    """On SIGTERM, how long health reports NOT_SERVING (and new calls get UNAVAILABLE, which
    clients retry elsewhere) before the server stops taking calls: time for load balancers
    and health-checking clients to move away. 1-5 s behind a load balancer (at most 3600)."""
    log_format: Literal["auto", "json", "console"] = "auto"
    """`json` lines, `console` key=value, or `auto`: console on a terminal, else JSON."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged. Per-request access lines are logged at debug."""
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    """The asyncio event loop: `uvloop` (faster per call), `asyncio` (the standard
    library's), or `auto`: uvloop when installed, else the standard loop."""
    switch_interval_us: int = Field(default=200, ge=50, le=100_000)
    """How often Python offers the GIL to another thread (sys.setswitchinterval). The event
    loop and the model lanes take turns on it; Python's 5000 us default makes completions
    wait behind the loop (measured: ~20% fewer Predicts/s at 32 in flight)."""
    cuda_device: int = Field(default=0, ge=0)
    """The CUDA device (as numbered after CUDA_VISIBLE_DEVICES) that GPU models run on."""
    max_concurrent_streams: int = Field(default=0, ge=0, le=INT32_MAX)
    """Calls one HTTP/2 connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS);
    further calls wait on the client. 0: gRPC's default (no limit); at most 2147483647."""
    keepalive_time_seconds: float = Field(default=60.0, gt=0, le=MAX_TRANSPORT_SECONDS)
    """How long a connection may be idle before the server pings the client (at most a
    week, 604800, like every keepalive and connection-age duration)."""
    keepalive_timeout_seconds: float = Field(default=20.0, gt=0, le=MAX_TRANSPORT_SECONDS)
    """How long the server waits for a ping's answer before it closes the connection."""
    keepalive_min_client_interval_seconds: float = Field(
        default=10.0, ge=0, le=MAX_TRANSPORT_SECONDS
    )
    """Shortest interval between client pings the server tolerates (clients that ping more
    often are sent GOAWAY); clients may ping on idle connections too."""
    max_connection_age_seconds: float = Field(default=0.0, ge=0, le=MAX_TRANSPORT_SECONDS)
    """Close each connection (GOAWAY, ±10% jitter) after this long, so clients behind a load
    balancer reconnect and spread over new instances; 0: connections live on."""
    max_connection_age_grace_seconds: float = Field(default=0.0, ge=0, le=MAX_TRANSPORT_SECONDS)
    """After max_connection_age, how long calls in progress may still run before the
    connection is closed; 0: as long as they need."""
    frontends: int | Literal["auto"] = Field(default=0)
    """gRPC frontend processes in front of one engine process. 0 (the default): one
    process serves everything. N: N processes share the port (SO_REUSEPORT), each decoding,
    validating, authenticating and encoding calls, while one engine process owns the models,
    batching and the device; for hosts where one core's Python caps throughput (see
    docs/operations.md). `auto`: one per two cores past the first four, none below 8
    cores. x86-64 only (the rings between the processes rely on its memory ordering):
    elsewhere `auto` means 0 and a number above 0 is refused. Changing it needs a
    restart."""
    model_control: Literal["none", "explicit"] = "none"
    """How models come and go. `none`: every model of the repository loads at start, and a
    reload (SIGHUP) scans the repository again. `explicit`: only the models in
    `load_models` load at start; the others load and unload when a client asks (KServe's
    RepositoryModelLoad and RepositoryModelUnload, which tritonclient's load_model and
    unload_model send, with a token allowed `model_control`), and a reload scans again only
    the models loaded. Changing it needs a restart."""
    load_models: list[str] = Field(default_factory=list)
    """With model_control = "explicit": the models loaded at start (`*`: every one)."""
    ready_when: ReadyWhen = "any_model"
    """When health (`grpc.health.v1` and InferenceService/Health) says SERVING once the models
    have loaded. `any_model`: while at least one model has a READY version and so does every
    model whose model.toml says `required = true`; `all_models`: while every model has one
    (a model a reload adds counts from the start of its load); `always`: whatever the
    models' states (`required` is not consulted). Otherwise NOT_SERVING, so that load
    balancers send nothing to a daemon with nothing to serve; it follows loads, failures and
    reloads. Calls are answered either way."""

    @field_validator("frontends")
    @classmethod
    def _check_frontends(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 0 <= value <= MAX_FRONTENDS:
            raise ValueError(f'expected 0 to {MAX_FRONTENDS} or "auto", got {value}')
        return value

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"expected HOST:PORT such as 127.0.0.1:50051, got {value!r}")
        return value


class TensordConfig(BaseSettings, Settings):
    """The whole configuration file."""

    model_config = SettingsConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="_",
        env_nested_max_split=1,  # TENSORD_SERVER_MAX_RECEIVE_MESSAGE_BYTES: split once
        case_sensitive=False,  # the source lower-cases; TensordEnvironment keeps exact names
    )

    server: ServerSettings = ServerSettings()
    """Network, limits and logging."""
    model_repository: Path = Path("models")
    """Directory with one subdirectory per model (relative paths are from the config file)."""
    cache_directory: Path = Path("cache")
    """Where TensorRT engines and compiled kernels are cached (relative: as above)."""
    follow_model_symlinks: bool = False
    """Serve model files (and a generator's JSON files) that symlinks lead outside their
    model's directory (a shared store, Hugging Face's cache). Off, such a version fails
    with the reason."""
    tls: TLSSettings = TLSSettings()
    """TLS and mutual TLS on the gRPC port."""
    auth: AuthSettings = AuthSettings()
    """Bearer-token authentication, per-model permissions and per-token rate limits."""
    limits: LimitsSettings = LimitsSettings()
    """Admission limits: prompt length, concurrent Generate streams."""
    metrics: MetricsSettings = MetricsSettings()
    """The Prometheus endpoint."""
    tracing: TracingSettings = TracingSettings()
    """OpenTelemetry tracing."""
    openai: OpenAISettings = OpenAISettings()
    """The OpenAI-compatible HTTP API (off by default)."""

    @field_validator("model_repository", "cache_directory", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        # Path("") is the working directory: an empty setting is a mistake, not a choice.
        if isinstance(value, str) and not value.strip():
            raise ValueError(f"expected a directory path, got {value!r}")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """`TensordConfig()` is the defaults: load_config applies the file, the variables
        and the flags, each from the source it was given."""
        return (init_settings,)


# Settings holding paths: relative ones in the file are relative to the file.
_PATH_KEYS = (
    "model_repository",
    "cache_directory",
    "tls.cert_file",
    "tls.key_file",
    "tls.client_ca_file",
    "auth.token_file",
)


class TomlFileSource(InitSettingsSource):
    """The config file's tables, read with tensord's bounds (a regular file of at most 4 MiB,
    nested at most 64 levels), relative paths in it made relative to the file."""

    def __init__(self, path: Path) -> None:
        super().__init__(TensordConfig, _read_file(path))


class TensordEnvironment(EnvSettingsSource):
    """TENSORD_* variables, from `environ` (the process's environment by default). Only the
    names `env_keys()` lists count, spelled exactly so: pydantic-settings alone would also
    take lower-case names, whole tables as JSON (TENSORD_SERVER) and refuse a misspelt
    variable as an unknown key, where the daemon has always ignored unknown variables."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        keys = env_keys()
        given = os.environ if environ is None else environ
        self._given = {name: value for name, value in given.items() if name in keys}
        super().__init__(TensordConfig)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # The hook pydantic-settings' own dotenv source overrides to read elsewhere.
        return {name.lower(): value for name, value in self._given.items()}


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    override_names: Mapping[str, str] | None = None,
) -> TensordConfig:
    """Read the file (if any), apply TENSORD_* variables, then explicit overrides.

    Override keys are dotted paths such as ``server.listen`` or ``model_repository``;
    `override_names` says where each came from (a flag such as ``--listen``), so that an
    error names it rather than the file.
    """
    data = TomlFileSource(path)() if path is not None else {}
    origins: dict[str, str] = {}
    flags = {key: value for key, value in (overrides or {}).items() if value is not None}
    nested: dict[str, Any] = {}
    for key, value in flags.items():
        _set_dotted(nested, key, value)
    layers = (
        (TensordEnvironment(env)(), lambda key: ENV_PREFIX + key.replace(".", "_").upper()),
        (InitSettingsSource(TensordConfig, nested)(), _flag_name(override_names or {})),
    )
    for values, origin in layers:
        for key, value in _leaves(values):
            _set_dotted(data, key, value)
            origins[key] = origin(key)
    try:
        config = TensordConfig.model_validate(data)
    except ValidationError as exc:
        file = str(path) if path is not None else "(defaults)"
        raise ConfigError(format_validation_error(exc, file, origins)) from None
    config.model_repository = config.model_repository.resolve()
    config.cache_directory = config.cache_directory.resolve()
    for section in (config.tls, config.auth):
        for name, value in section:
            if isinstance(value, Path):
                setattr(section, name, value.resolve())
    return config


def _flag_name(names: Mapping[str, str]) -> Callable[[str], str]:
    return lambda key: names.get(key, f"override {key}")


def _leaves(values: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The dotted keys of a source's nested tables, with their values."""
    leaves: list[tuple[str, Any]] = []
    for name, value in values.items():
        if isinstance(value, Mapping):
            leaves += _leaves(value, f"{prefix}{name}.")
        else:
            leaves.append((f"{prefix}{name}", value))
    return leaves


def _read_file(path: Path) -> dict[str, Any]:
    """The file's tables, with relative paths made relative to the file."""
    data = read_toml(path, ConfigError, f"config {path}")
    # A relative directory in the file is relative to the file; from a flag or
    # variable, to the working directory.
    for key in _PATH_KEYS:
        table, _, leaf = key.rpartition(".")
        node = data.get(table, {}) if table else data
        value = node.get(leaf) if isinstance(node, dict) else None
        if isinstance(value, str) and value.strip() and not Path(value).is_absolute():
            node[leaf] = str(path.parent / value)
    return data


def env_keys() -> dict[str, str]:
    """Every TENSORD_* variable the daemon reads, mapped to the setting it overrides.

    TENSORD_MODEL_REPOSITORY -> model_repository, TENSORD_SERVER_LISTEN -> server.listen,
    TENSORD_TLS_CERT_FILE -> tls.cert_file: one variable per key of every table.
    """
    keys = {}
    for name, field in TensordConfig.model_fields.items():
        table = field.annotation
        if isinstance(table, type) and issubclass(table, BaseModel):
            for sub in table.model_fields:
                keys[f"{ENV_PREFIX}{name.upper()}_{sub.upper()}"] = f"{name}.{sub}"
        else:
            keys[f"{ENV_PREFIX}{name.upper()}"] = name
    return keys


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{part}: expected a table, got {child!r}")
        node = child
    node[leaf] = value


def format_validation_error(
    exc: ValidationError, source: str, origins: Mapping[str, str] | None = None
) -> str:
    """One line per problem: the field's dotted path, what was wrong, what was given.

    `source` is the file; `origins` maps dotted keys set elsewhere (a TENSORD_* variable,
    a flag) to their name, so a problem is blamed on where its value came from.
    """
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        problems.append((loc, _origin(err["loc"], origins or {}, source), _describe(err)))
    where = list(dict.fromkeys(origin for _, origin, _ in problems))
    lines = [f"{', '.join(where)}: {exc.error_count()} invalid setting(s)"]
    for loc, origin, text in problems:
        named = f"{loc} (from {origin})" if len(where) > 1 else loc
        lines.append(f"  {named}: {text}")
    return "\n".join(lines)


def _origin(loc: tuple[int | str, ...], origins: Mapping[str, str], source: str) -> str:
    """Where the value at `loc` came from: the longest dotted prefix that was set apart."""
    parts = [str(p) for p in loc]
    for end in range(len(parts), 0, -1):
        origin = origins.get(".".join(parts[:end]))
        if origin is not None:
            return origin
    return source


def _describe(err: Any) -> str:
    """The message in tensord's words, then the value given unless the message shows it."""
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; docs/configuration.md lists every key)"
    if kind == "missing":
        return "missing: this key is required"
    if kind in ("value_error", "assertion_error") and "error" in err.get("ctx", {}):
        msg = str(err["ctx"]["error"])  # our own message, without pydantic's prefix
    elif msg.startswith("Input should be "):
        wanted = msg.removeprefix("Input should be ")
        if wanted.startswith(("greater", "less")):
            wanted = f"a value {wanted}"
        msg = f"expected {wanted}"
    given = err.get("input")
    if isinstance(given, dict) or ", got " in msg:  # our messages say what they were given
        return msg
    return f"{msg} (got {given!r})"
