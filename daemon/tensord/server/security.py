"""The server's transport security and admission: TLS, bearer tokens, stream limits.

One object per server builds the credentials and interceptors from the configuration and
re-reads certificates and the token file on `reload()`.
"""

from __future__ import annotations

import grpc
import structlog

from tensord.config import ServerSettings, TensordConfig
from tensord.errors import ConfigError
from tensord.server.auth import Authenticator
from tensord.server.interceptors import AuthInterceptor, RejectHook
from tensord.server.kit.rpc import StreamSlots
from tensord.server.tls import ServerTLS

log = structlog.get_logger("tensord.server")


def transport_options(s: ServerSettings, reuse_port: bool = False) -> list[tuple[str, int]]:
    """gRPC server options: message limits, streams per connection, keepalive, age;
    SO_REUSEPORT only for a frontend process, which shares the port with the others."""
    ms = 1000
    ping_interval = int(s.keepalive_min_client_interval_seconds * ms)
    options = [
        ("grpc.max_receive_message_length", s.max_receive_message_bytes),
        ("grpc.max_send_message_length", s.max_send_message_bytes),
        # Two daemons must not share a port silently (frontends hold an instance lock).
        ("grpc.so_reuseport", int(reuse_port)),
        ("grpc.keepalive_time_ms", int(s.keepalive_time_seconds * ms)),
        ("grpc.keepalive_timeout_ms", int(s.keepalive_timeout_seconds * ms)),
        # Tolerate client pings this often, also on connections with no call open.
        ("grpc.http2.min_ping_interval_without_data_ms", ping_interval),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    if s.max_concurrent_streams:
        options.append(("grpc.max_concurrent_streams", s.max_concurrent_streams))
    if s.max_connection_age_seconds:
        options.append(("grpc.max_connection_age_ms", int(s.max_connection_age_seconds * ms)))
        if s.max_connection_age_grace_seconds:
            grace = int(s.max_connection_age_grace_seconds * ms)
            options.append(("grpc.max_connection_age_grace_ms", grace))
    return options


class Security:
    """TLS credentials, the authenticator and the interceptors of one server."""

    def __init__(self, config: TensordConfig, on_reject: RejectHook | None = None) -> None:
        self.tls = ServerTLS(config.tls) if config.tls.enabled else None
        self.authenticator = Authenticator(config.auth) if config.auth.enabled else None
        self.stream_limit = (
            StreamSlots(config.limits.max_generate_streams)
            if config.limits.max_generate_streams
            else None
        )
        """The Generate stream slots the servicer takes once a request has arrived."""
        self.interceptors: list[grpc.aio.ServerInterceptor] = []
        if self.authenticator is not None:
            self.interceptors.append(AuthInterceptor(self.authenticator, on_reject))

    @property
    def mode(self) -> str:
        """`plaintext`, `tls` or `mtls`."""
        if self.tls is None:
            return "plaintext"
        return "mtls" if self.tls.mutual else "tls"

    def add_port(self, server: grpc.aio.Server, listen: str) -> int:
        """Bind `listen` with TLS when configured; the bound port."""
        if self.tls is not None:
            return server.add_secure_port(listen, self.tls.credentials)
        return server.add_insecure_port(listen)

    def reload(self, config: TensordConfig | None = None) -> None:
        """Re-read the certificates and the token file. Each part that fails keeps what it
        had; ConfigError then lists every failure."""
        problems = []
        if self.tls is not None:
            try:
                self.tls.reload(config.tls if config is not None else None)
            except ConfigError as exc:
                problems.append(str(exc))
        if self.authenticator is not None:
            try:
                self.authenticator.reload(config.auth if config is not None else None)
            except ConfigError as exc:
                problems.append(str(exc))
        if problems:
            raise ConfigError("; ".join(problems))
