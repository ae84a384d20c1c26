"""The `[tls]`, `[auth]`, `[limits]`, `[metrics]`, `[tracing]` and `[openai]` tables of the
configuration.

They live beside `tensord.config` (which nests them in TensordConfig) and import nothing
but pydantic, so every layer may read them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

INT32_MAX = 2**31 - 1
"""gRPC takes its channel arguments (message sizes, streams per connection) as C ints, and
ONNX Runtime and TensorRT their sizes as 32-bit ints."""
MAX_THREADS = 1024
"""The most threads one ONNX Runtime session may be given per pool."""
MAX_INSTANCES = 256
"""The most instances (lanes, sessions) of one model."""


def _takes_number(annotation: Any) -> bool:
    """Whether a field's type admits an int or a float (through unions and Annotated)."""
    if annotation in (int, float):
        return True
    return any(_takes_number(arg) for arg in get_args(annotation) if arg is not bool)


def _boolean_for_number(cls: type[BaseModel], name: str, value: Any) -> str | None:
    """The complaint when `value` is a boolean given for a numeric field `name`."""
    field = cls.model_fields.get(name)
    if isinstance(value, bool) and field is not None and _takes_number(field.annotation):
        return f"expected a number, got the boolean {str(value).lower()}"
    return None


class Settings(BaseModel):
    """The base of every settings table. A boolean is refused where a number is expected
    (pydantic alone would take `true` as 1). Each field's docstring is its description
    (docs/configuration.md is generated from them)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        problem = _boolean_for_number(cls, info.field_name or "", value)
        if problem:
            raise ValueError(problem)
        return value


class TaggedSettings(BaseModel):
    """Settings for a member of a discriminated union (its tag may not have a field
    validator): the same check, per table, naming the key."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in cls.model_fields:
                problem = _boolean_for_number(cls, name, data.get(name))
                if problem:
                    raise ValueError(f"{name}: {problem}")
        return data


def _empty_is_none(value: Any) -> Any:
    """An empty string (as an environment variable gives it) means unset."""
    return None if value == "" else value


def check_host_port(value: str) -> str:
    """HOST:PORT with a numeric port (IPv6 hosts in brackets)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:50051, got {value!r}")
    return value


class TLSSettings(Settings):
    """The `[tls]` table: the gRPC port speaks TLS when a certificate and key are set."""

    model_config = ConfigDict(extra="forbid")

    cert_file: Path | None = None
    """PEM certificate chain the server presents (leaf first). With `key_file`, the gRPC
    port serves TLS only; unset, it serves plaintext."""
    key_file: Path | None = None
    """PEM private key of `cert_file`."""
    client_ca_file: Path | None = None
    """PEM bundle of certificate authorities. When set, every client must present a
    certificate signed by one of them (mutual TLS); unset, client certificates are not asked
    for."""

    @field_validator("cert_file", "key_file", "client_ca_file", mode="before")
    @classmethod
    def _unset(cls, value: Any) -> Any:
        return _empty_is_none(value)

    @model_validator(mode="after")
    def _pairs(self) -> TLSSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set both cert_file and key_file, or neither")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("client_ca_file needs cert_file and key_file (mutual TLS is TLS)")
        return self

    @property
    def enabled(self) -> bool:
        """True when the server serves TLS."""
        return self.cert_file is not None


class AuthSettings(Settings):
    """The `[auth]` table: bearer tokens from a file of hashes, each with allowed models."""

    model_config = ConfigDict(extra="forbid")

    token_file: Path | None = None
    """TOML file of `[[token]]` entries (name, sha256, models, optional rate limits); see
    docs/security.md and `tensord hash-token`. Unset: no authentication.
    Re-read on reload; turning authentication on or off needs a restart."""
    open_health: bool = True
    """`grpc.health.v1.Health` and `tensord.v1.InferenceService/Health` answer without a
    token, so load balancers and probes need none. Without a token a caller learns the
    server's status and no model list; `grpc.health.v1` Check and Watch of
    `tensord.model.<name>` still answer, as load balancers probe a model by name."""
    open_reflection: bool = False
    """Server reflection answers without a token (it describes the API, never data)."""
    rate_per_second: float = Field(default=0.0, ge=0, le=1e9, allow_inf_nan=False)
    """Requests per second each token may make, unless its entry sets its own; 0: no limit.
    Beyond it, RESOURCE_EXHAUSTED with the time to wait."""
    burst: int = Field(default=0, ge=0, le=1_000_000_000)
    """Requests a token may make at once above its rate (the bucket size); 0: the rate
    rounded up, at least 1."""

    @field_validator("token_file", mode="before")
    @classmethod
    def _unset(cls, value: Any) -> Any:
        return _empty_is_none(value)

    @property
    def enabled(self) -> bool:
        """True when requests must bring a token."""
        return self.token_file is not None


class LimitsSettings(Settings):
    """The `[limits]` table: admission limits beyond the transport's."""

    model_config = ConfigDict(extra="forbid")

    max_prompt_tokens: int = Field(default=0, ge=0, le=INT32_MAX)
    """Longest prompt, in tokens, that Generate accepts (longer: INVALID_ARGUMENT); 0: only
    the model's context length bounds it."""
    max_generate_streams: int = Field(default=0, ge=0, le=INT32_MAX)
    """Generate streams in progress at once across the daemon; more get RESOURCE_EXHAUSTED
    at once. 0: no limit beyond the engine's own."""
    max_tensors_per_request: int = Field(default=256, ge=1, le=1_000_000)
    """Input tensors (and output names) one Predict request may hold; more get
    INVALID_ARGUMENT before the request is parsed."""
    max_request_fields: int = Field(default=65_536, ge=256, le=100_000_000)
    """Protobuf fields one request may hold, counted before it is parsed (a repeated number
    field sent packed, as every proto3 library sends it, is one field); more get
    RESOURCE_EXHAUSTED. Bounds what parsing one request costs the event loop."""
    max_typed_integers: int = Field(default=4 * 1024 * 1024, ge=0, le=2**40)
    """Bool and integer values one Predict request may carry as typed contents
    (`contents.bool_values`, `int_values`, `int64_values`); more get INVALID_ARGUMENT before
    the request is parsed. Each costs the parser about 10 ns of the interpreter lock, so
    this bounds how long one request can hold up the others; `raw_data` has no such cost.
    0: no limit."""
    max_request_bytes_in_flight: int = Field(default=1024 * 1024 * 1024, ge=0, le=2**62)
    """Bytes of request messages held by calls in progress at once (with typed integers
    counted at their parsed size, 8 bytes each); a request that would pass it gets
    RESOURCE_EXHAUSTED (retry shortly). 0: no limit. Messages still arriving are held by
    gRPC, outside this budget: server.max_receive_message_bytes times the streams in
    progress bounds them."""
    receive_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    """How long a call may take to deliver its request message once it has started; then
    DEADLINE_EXCEEDED. A call that ends without a message gets INVALID_ARGUMENT."""


class EndpointSettings(Settings):
    """A table whose `listen` turns an HTTP endpoint of its own on (empty: off)."""

    listen: str = ""

    @field_validator("listen")
    @classmethod
    def _check(cls, value: str) -> str:
        return check_host_port(value) if value else value

    @property
    def enabled(self) -> bool:
        """True when the endpoint is served."""
        return bool(self.listen)


class MetricsSettings(EndpointSettings):
    """The `[metrics]` table: Prometheus metrics on their own HTTP port."""

    model_config = ConfigDict(extra="forbid")

    listen: str = ""
    """HOST:PORT of the HTTP endpoint that serves `/metrics` in the Prometheus text format;
    empty (the default): no endpoint and no recording. Port 0 picks a free port."""


class TracingSettings(Settings):
    """The `[tracing]` table: OpenTelemetry spans, one per RPC (the `otel` extra)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Export a span per RPC (model, status, request id). Needs the `otel` extra (in the
    clone: `pip install -e ".[otel]"`);
    enabled without it, the daemon logs `tracing.unavailable` and serves on."""
    service_name: str = "tensord"
    """The `service.name` resource attribute of the spans."""
    otlp_endpoint: str = ""
    """OTLP/gRPC collector such as `http://127.0.0.1:4317`; empty: the exporter's own
    default or the OTEL_EXPORTER_OTLP_* variables."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of traces sampled at the root; a caller's sampled `traceparent` is followed."""


class OpenAISettings(EndpointSettings):
    """The `[openai]` table: the OpenAI-compatible HTTP API for generator models."""

    model_config = ConfigDict(extra="forbid")

    listen: str = ""
    """HOST:PORT of the HTTP endpoint that serves `/v1/models`, `/v1/completions` and
    `/v1/chat/completions` (the `openai-api` extra: Starlette and uvicorn); empty (the
    default): not served. Port 0 picks a free port. The same tokens, permissions and
    limits apply as on the gRPC port; with `[tls]` on it serves HTTPS with the same
    certificate, key and client CA (reloaded with them), else plain HTTP."""

    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=INT32_MAX)
    """The largest request body, in bytes: a larger one gets 413 before it is read. A body
    is parsed as JSON on the event loop, so this bounds how long one request can hold it:
    2 MiB (the default, as TGI's and TEI's payload limits) takes a few ms for text and up to
    ~80 ms for a million token ids. It holds a prompt of ~500k tokens of text; a prompt the
    model's context cannot hold is refused from its size before it is tokenised."""
