"""TLS and mutual TLS for the gRPC port, with certificates that can be re-read while serving.

gRPC's dynamic server credentials ask a fetcher for a new certificate configuration before
every TLS handshake; `reload()` reads and checks the files and hands the fetcher the new
configuration, so new connections get the new certificate while open ones carry on.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from tensord.config_tables import TLSSettings
from tensord.errors import ConfigError
from tensord.files import read_regular_file

log = structlog.get_logger("tensord.tls")


@dataclass(slots=True, frozen=True)
class CertificateFiles:
    """The PEM contents read from the [tls] files."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None


MAX_PEM_BYTES = 4 * 1024 * 1024
"""The largest certificate chain, key or CA bundle read (a system's whole CA bundle takes
a few hundred kilobytes)."""


def read_certificates(settings: TLSSettings) -> CertificateFiles:
    """Read and check the files: the key must match the certificate, the CA bundle must
    parse; ConfigError names the file and the problem. The checks run on the bytes read,
    the same that gRPC is given."""
    if settings.cert_file is None or settings.key_file is None:
        raise ConfigError("tls: cert_file and key_file are not set")
    cert = _read(settings.cert_file, "cert_file")
    key = _read(settings.key_file, "key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        with _in_memory(cert) as cert_path, _in_memory(key) as key_path:
            context.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"tls: {settings.cert_file} and {settings.key_file} are not a PEM certificate "
            f"chain and its private key ({exc.reason or exc})"
        ) from None
    ca = None
    if settings.client_ca_file is not None:
        ca = _read(settings.client_ca_file, "client_ca_file")
        try:
            with _in_memory(ca) as ca_path:
                context.load_verify_locations(cafile=ca_path)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"tls: client_ca_file {settings.client_ca_file} holds no PEM certificate "
                f"({exc.reason or exc})"
            ) from None
    return CertificateFiles(cert, key, ca)


def _read(path: Path, key: str) -> bytes:
    """A regular file of at most MAX_PEM_BYTES: a FIFO would hang the reload (SIGHUP)."""
    label = f"tls: {key} {path}"
    expected = f"a PEM file of at most {MAX_PEM_BYTES >> 20} MiB"
    return read_regular_file(path, MAX_PEM_BYTES, ConfigError, expected, label)


@contextlib.contextmanager
def _in_memory(data: bytes) -> Iterator[str]:
    """A path that reads `data` from memory (a memfd), for `ssl`, which reads only paths:
    no copy of a private key is written to disk."""
    with open(os.memfd_create("tensord-tls", os.MFD_CLOEXEC), "wb") as f:
        f.write(data)
        f.flush()
        yield f"/proc/self/fd/{f.fileno()}"


def _configuration(files: CertificateFiles) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(files.private_key, files.cert_chain)], root_certificates=files.client_ca
    )


def _ssl_context(files: CertificateFiles) -> ssl.SSLContext:
    """A server SSLContext of these files (TLS 1.2 or later; client certificates required
    when there is a client CA)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with _in_memory(files.cert_chain) as cert_path, _in_memory(files.private_key) as key_path:
        context.load_cert_chain(cert_path, key_path)
    if files.client_ca is not None:
        context.load_verify_locations(cadata=files.client_ca.decode("ascii", "replace"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ServerTLS:
    """The server's TLS credentials; `reload()` swaps certificates for new connections.

    Whether client certificates are required is fixed at start (it is part of the
    credentials); a reload can change the certificate, the key and the client CA bundle.
    """

    def __init__(self, settings: TLSSettings) -> None:
        self.settings = settings
        self.files = read_certificates(settings)
        self.mutual = settings.client_ca_file is not None
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._lock = threading.Lock()  # the fetcher runs on gRPC's threads
        self._ssl: ssl.SSLContext | None = None
        """The newest SSLContext of the files, once another listener asked for one."""
        self.credentials = grpc.dynamic_ssl_server_credentials(
            _configuration(self.files),
            self._fetch,
            require_client_authentication=self.mutual,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC asks before each handshake: a new configuration once after a reload."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def reload(self, settings: TLSSettings | None = None) -> None:
        """Re-read the certificate, key and client CA; a bad set keeps the old one in force
        and raises ConfigError."""
        settings = settings or self.settings
        if (settings.client_ca_file is not None) != self.mutual:
            raise ConfigError("tls: turning mutual TLS on or off (client_ca_file) needs a restart")
        files = read_certificates(settings)
        context = _ssl_context(files) if self._ssl is not None else None
        with self._lock:
            self._pending = _configuration(files)
            self.files, self.settings = files, settings
            if context is not None:
                self._ssl = context
        log.info(
            "tls.reloaded",
            cert_file=str(settings.cert_file),
            client_ca_file=str(settings.client_ca_file) if settings.client_ca_file else None,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """An SSLContext for another listener on these files (the OpenAI HTTP port): each
        handshake switches to the context of the newest files, so a reload reaches it as it
        reaches the gRPC port."""
        self._ssl = _ssl_context(self.files)
        outer = _ssl_context(self.files)
        outer.set_alpn_protocols(["http/1.1"])

        def newest(connection: Any, server_name: str | None, context: ssl.SSLContext) -> None:
            current = self._ssl
            if current is not None:
                connection.context = current

        outer.sni_callback = newest
        return outer
