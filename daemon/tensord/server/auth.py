"""Bearer-token authentication: a token file of SHA-256 hashes, allow-lists, rate limits.

Tokens are stored as the SHA-256 hex digest of the token, unsalted. A salted or slow hash
protects guessable secrets such as passwords; tensord's tokens are random strings of at
least 128 bits (`tensord hash-token` makes 256-bit ones), which no dictionary holds and no
brute force reaches, so a fast hash loses nothing — and it lets a presented token be found by
its digest in one dictionary lookup instead of trying every entry. Whoever reads the token
file learns names, permissions and digests, never a usable token.

The token file (TOML):

    [[token]]
    name = "batch-jobs"                 # shown in logs and in PERMISSION_DENIED messages
    sha256 = "9f86d081884c7d65..."      # `tensord hash-token` prints this entry
    models = ["mlp", "cnn"]             # or ["*"] for every model
    rate_per_second = 20.0              # optional; default [auth] rate_per_second
    burst = 40                          # optional; default [auth] burst
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from pydantic import ConfigDict, Field, ValidationError, field_validator

from tensord.access import Principal
from tensord.config_tables import AuthSettings, Settings
from tensord.errors import ConfigError, RateLimitedError, UnauthenticatedError
from tensord.files import read_toml
from tensord.server.ratelimit import Rate, TokenBucket
from tensord.server.watchdog import PROBED_METHOD

log = structlog.get_logger("tensord.auth")

AUTHORIZATION = "authorization"
MIN_TOKEN_LENGTH = 16
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEALTH_METHODS = ("/grpc.health.v1.Health/", PROBED_METHOD)
_REFLECTION_METHODS = ("/grpc.reflection.",)


def hash_token(token: str) -> str:
    """The digest stored in the token file: SHA-256 of the token's UTF-8 bytes, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token: 32 bytes from the OS's CSPRNG, URL-safe base64 (43 chars)."""
    return secrets.token_urlsafe(32)


_MAX_RETRY_S = 86_400.0


def token_entry(
    name: str, digest: str, models: Sequence[str], rate: float = 0.0, burst: int = 0
) -> str:
    """A `[[token]]` entry for the token file, as TOML."""
    quoted = ", ".join(toml_string(m) for m in models)
    lines = [
        "[[token]]",
        f"name = {toml_string(name)}",
        f'sha256 = "{digest}"',
        f"models = [{quoted}]",
    ]
    if rate:
        lines.append(f"rate_per_second = {rate}")
    if burst:
        lines.append(f"burst = {burst}")
    return "\n".join(lines) + "\n"


def toml_string(text: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped, everything
    else as it is (JSON's escapes split characters beyond U+FFFF into surrogate pairs,
    which TOML refuses)."""
    escaped = "".join(
        f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c
        for c in text.replace("\\", "\\\\").replace('"', '\\"')
    )
    return f'"{escaped}"'


class TokenEntry(Settings):
    """One `[[token]]` of the token file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """A label for logs and messages; unique in the file."""
    sha256: str
    """The token's SHA-256 digest, 64 lowercase hex digits."""
    models: list[str] = Field(min_length=1)
    """Models this token may use; `*` allows every model."""
    rate_per_second: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    """Requests per second for this token; absent: [auth] rate_per_second; 0: no limit."""
    burst: int | None = Field(default=None, ge=0, le=1_000_000_000)
    """Bucket size for this token; absent: [auth] burst."""
    model_control: bool = False
    """The token may load and unload models (RepositoryModelLoad and RepositoryModelUnload,
    with [server] model_control = "explicit"), those of `models`."""

    @field_validator("sha256")
    @classmethod
    def _digest(cls, value: str) -> str:
        value = value.strip().lower()
        if not _HEX64.fullmatch(value):
            raise ValueError("expected 64 hex digits (run `tensord hash-token`)")
        return value


class TokenFile(Settings):
    """The whole token file."""

    model_config = ConfigDict(extra="forbid")

    token: list[TokenEntry] = Field(default_factory=list)


@dataclass(slots=True, frozen=True)
class _Grant:
    principal: Principal
    rate: Rate


def read_token_file(path: Path, settings: AuthSettings) -> dict[str, _Grant]:
    """The token file's entries by digest; ConfigError names the file and the bad entry."""
    data = read_toml(path, ConfigError, f"token file {path}")
    try:
        parsed = TokenFile.model_validate(data)
    except ValidationError as exc:
        from tensord.config import format_validation_error

        raise ConfigError(format_validation_error(exc, f"token file {path}")) from None
    grants: dict[str, _Grant] = {}
    names: set[str] = set()
    for entry in parsed.token:
        if entry.name in names:
            raise ConfigError(f"token file {path}: two tokens are named {entry.name!r}")
        if entry.sha256 in grants:
            raise ConfigError(f"token file {path}: token {entry.name!r} repeats another's sha256")
        names.add(entry.name)
        rate = Rate.of(
            settings.rate_per_second if entry.rate_per_second is None else entry.rate_per_second,
            settings.burst if entry.burst is None else entry.burst,
        )
        principal = Principal(entry.name, frozenset(entry.models), entry.model_control)
        grants[entry.sha256] = _Grant(principal, rate)
    return grants


class Authenticator:
    """Checks bearer tokens against the token file and meters each token's rate.

    `reload()` re-reads the file (and optionally new [auth] settings); a bad file keeps the
    tokens in force and raises ConfigError for the caller to log.
    """

    def __init__(self, settings: AuthSettings) -> None:
        if settings.token_file is None:
            raise ConfigError("auth: token_file is not set")
        self.settings = settings
        self._grants: dict[str, _Grant] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()  # reload may run on another thread
        self.reload()

    def reload(self, settings: AuthSettings | None = None) -> int:
        """Re-read the token file; returns how many tokens are in force."""
        settings = settings or self.settings
        if settings.token_file is None:
            raise ConfigError("auth: token_file cannot be unset while serving; restart instead")
        grants = read_token_file(settings.token_file, settings)
        with self._lock:
            buckets = {}
            for digest, grant in grants.items():
                if not grant.rate.limited:
                    continue
                bucket = self._buckets.get(digest)
                if bucket is None:
                    bucket = TokenBucket(grant.rate)
                else:
                    bucket.retune(grant.rate)
                buckets[digest] = bucket
            self._grants, self._buckets, self.settings = grants, buckets, settings
        log.info("auth.tokens_loaded", path=str(settings.token_file), tokens=len(grants))
        return len(grants)

    def is_open(self, method: str) -> bool:
        """True for methods that answer without a token (health, reflection, by config)."""
        s = self.settings
        return (s.open_health and method.startswith(_HEALTH_METHODS)) or (
            s.open_reflection and method.startswith(_REFLECTION_METHODS)
        )

    def admit(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Principal:
        """The caller named by `authorization: Bearer <token>`, after taking one request from
        its rate: UNAUTHENTICATED without a known token, RESOURCE_EXHAUSTED over the rate."""
        digest = hash_token(bearer_token(metadata))
        grant = self._grants.get(digest)
        if grant is None:
            raise UnauthenticatedError(
                "invalid bearer token: it matches no entry of the server's token file"
            )
        bucket = self._buckets.get(digest)
        if bucket is not None:
            with self._lock:
                wait = bucket.take(time.monotonic())
            if wait > 0:
                # Whole ms, as the retry hints carry it; at most a day (a rate of 1e-300 per
                # second would otherwise give a wait no hint can hold).
                wait = math.ceil(min(wait, _MAX_RETRY_S) * 1e3) / 1e3
                rate = bucket.rate
                quota = f"{rate.per_second:g} requests/s (burst {rate.burst})"
                raise RateLimitedError(
                    f"token {grant.principal.name!r} is over its rate limit of {quota}; "
                    f"retry in {wait:.3f} s",
                    wait,
                    subject=f"token:{grant.principal.name}",
                    quota=f"rate limit of {quota}",
                )
        return grant.principal


def has_authorization(metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
    """Whether the call carries `authorization` metadata."""
    return any(key == AUTHORIZATION for key, _ in metadata or ())


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    """The token of the `authorization: Bearer ...` metadata; UNAUTHENTICATED if absent."""
    for key, value in metadata or ():
        if key != AUTHORIZATION:
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError(
                "the authorization metadata must be 'Bearer <token>'; got another scheme"
            )
        return token.strip()
    raise UnauthenticatedError(
        "missing credentials: send the metadata 'authorization: Bearer <token>' "
        "(tensorctl --token, or the client's token= argument)"
    )
