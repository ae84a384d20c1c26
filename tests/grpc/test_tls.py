"""TLS and mutual TLS on a real server, with certificates made by the test; re-reading them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from tensord.errors import ConfigError
from tensord_client import Client, TLSOptions
from tensord_client.cli import main as tensorctl
from tests.certs import CertificateAuthority, Issued
from tests.conftest import ServerThread, serve

# Every client gets its own connection: no subchannel shared between test clients.
FRESH = [("grpc.use_local_subchannel_pool", 1)]
X = np.zeros((1, 512), np.float32)


@dataclass
class PKI:
    ca: CertificateAuthority
    other_ca: CertificateAuthority
    server: Issued
    client: Issued
    stranger: Issued
    """A client certificate from a CA the server does not trust."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    root = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(root, "tensord test CA")
    other = CertificateAuthority(root, "other CA")
    return PKI(
        ca,
        other,
        ca.issue("tensord.test", server=True, stem="server"),
        ca.issue("client-1", server=False),
        other.issue("stranger", server=False),
    )


def client(srv: ServerThread, tls: TLSOptions | None) -> Client:
    return Client(srv.target, timeout=10, tls=tls, retries=0, options=FRESH)


def healthy(srv: ServerThread, tls: TLSOptions | None) -> bool:
    with client(srv, tls) as c:
        try:
            c.health()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return False
    return True


@pytest.fixture(scope="module")
def tls_server(small_repo: Path, pki: PKI) -> Iterator[ServerThread]:
    srv = serve(small_repo, tls__cert_file=pki.server.cert_file, tls__key_file=pki.server.key_file)
    yield srv
    srv.stop()


def test_tls_serves_clients_that_trust_the_ca(tls_server: ServerThread, pki: PKI) -> None:
    trusted = TLSOptions(root_certificates=pki.ca.cert_file)
    with client(tls_server, trusted) as c:
        assert c.predict("mlp", {"input": X})["output"].shape == (1, 10)
    # The certificate also names tensord.test: a client may verify that name instead.
    by_name = TLSOptions(root_certificates=pki.ca.cert_pem, server_name_override="tensord.test")
    assert healthy(tls_server, by_name)
    assert tls_server.server is not None and tls_server.server.security.mode == "tls"


def test_tls_refuses_plaintext_and_untrusted_servers(tls_server: ServerThread, pki: PKI) -> None:
    assert not healthy(tls_server, None)
    assert not healthy(tls_server, TLSOptions(root_certificates=pki.other_ca.cert_file))


def test_mutual_tls_requires_a_client_certificate_from_the_ca(
    small_repo: Path, pki: PKI, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = serve(
        small_repo,
        tls__cert_file=pki.server.cert_file,
        tls__key_file=pki.server.key_file,
        tls__client_ca_file=pki.ca.cert_file,
    )
    try:
        ca = pki.ca.cert_file
        assert srv.server is not None and srv.server.security.mode == "mtls"
        assert not healthy(srv, TLSOptions(root_certificates=ca))
        stranger = pki.stranger
        assert not healthy(
            srv, TLSOptions(ca, certificate_chain=stranger.cert_file, private_key=stranger.key_file)
        )
        mine = TLSOptions(ca, certificate_chain=pki.client.cert_pem, private_key=pki.client.key_pem)
        with client(srv, mine) as c:
            assert c.predict("mlp", {"input": X})["output"].shape == (1, 10)
        flags = ["--tls-ca", str(ca), "--tls-cert", str(pki.client.cert_file)]
        flags += ["--tls-key", str(pki.client.key_file)]
        assert tensorctl(["--target", srv.target, *flags, "health"]) == 0
        out = capsys.readouterr().out  # the server's log lines share stdout
        assert "\nserver: SERVING\n" in out and "\nmlp          1        READY\n" in out
        assert tensorctl(["--target", srv.target, *flags[:4], "health"]) == 2
        assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    finally:
        srv.stop()


def serve_with_copied_pair(repo: Path, pki: PKI, folder: Path) -> tuple[ServerThread, Path, Path]:
    """A TLS server over `repo` whose certificate and key are copies in `folder` (so that a
    test may change them); the server and the two paths."""
    cert, key = folder / "server.crt", folder / "server.key"
    cert.write_bytes(pki.server.cert_pem)
    key.write_bytes(pki.server.key_pem)
    return serve(repo, tls__cert_file=cert, tls__key_file=key), cert, key


def test_reload_serves_new_certificates_to_new_connections(
    small_repo: Path, pki: PKI, tmp_path: Path
) -> None:
    srv, cert, key = serve_with_copied_pair(small_repo, pki, tmp_path)
    try:
        assert srv.server is not None
        security = srv.server.security
        old, new = TLSOptions(pki.ca.cert_file), TLSOptions(pki.other_ca.cert_file)
        assert healthy(srv, old) and not healthy(srv, new)
        renewed = pki.other_ca.issue("tensord.test", server=True, stem="renewed")
        cert.write_bytes(renewed.cert_pem)
        key.write_bytes(renewed.key_pem)
        security.reload()
        assert healthy(srv, new) and not healthy(srv, old)
        # A key that does not belong to the certificate: refused, the renewed pair stays.
        key.write_bytes(pki.client.key_pem)
        with pytest.raises(ConfigError, match="are not a PEM certificate chain and its private"):
            security.reload()
        os.remove(cert)
        with pytest.raises(ConfigError, match=r"tls: cert_file .*: cannot read"):
            security.reload()
        assert healthy(srv, new)
    finally:
        srv.stop()


def test_bad_tls_settings_fail_at_start(small_repo: Path, pki: PKI, tmp_path: Path) -> None:
    from tensord.config import load_config

    with pytest.raises(ConfigError, match="set both cert_file and key_file, or neither"):
        load_config(None, env={"TENSORD_TLS_CERT_FILE": str(pki.server.cert_file)})
    with pytest.raises(ConfigError, match="client_ca_file needs cert_file and key_file"):
        load_config(None, env={"TENSORD_TLS_CLIENT_CA_FILE": str(pki.ca.cert_file)})
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        serve(
            small_repo,
            tls__cert_file=pki.server.cert_file,
            tls__key_file=pki.server.key_file,
            tls__client_ca_file=garbage,
        )


def test_a_fifo_or_an_oversized_certificate_file_is_refused_at_reload(
    small_repo: Path, pki: PKI, tmp_path: Path
) -> None:
    """A reload (SIGHUP) reads each file only as a regular file of at most 4 MiB: a FIFO
    would hold the reload until somebody wrote to it. The pair in force stays."""
    from tensord.server.tls import MAX_PEM_BYTES

    srv, _cert, key = serve_with_copied_pair(small_repo, pki, tmp_path)
    try:
        assert srv.server is not None
        key.unlink()
        os.mkfifo(key)
        result = srv.call(srv.server.reload())  # what SIGHUP does
        bound = "expected a PEM file of at most 4 MiB"
        assert result.hook_errors == [
            f"TensordServer._reload_security: tls: key_file {key}: is a FIFO; {bound}"
        ]
        key.unlink()
        with open(key, "wb") as f:  # sparse: nothing is written
            f.truncate(MAX_PEM_BYTES + 1)
        with pytest.raises(ConfigError) as info:
            srv.server.security.reload()
        assert str(info.value) == (
            f"tls: key_file {key}: is larger than {MAX_PEM_BYTES} bytes; {bound}"
        )
        assert healthy(srv, TLSOptions(pki.ca.cert_file))
    finally:
        srv.stop()


def _https_status(port: int, ca: Path, client_pair: Issued | None) -> int:
    """GET /v1/models over HTTPS trusting `ca`, with a client certificate when given."""
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    if client_pair is not None:
        context.load_cert_chain(client_pair.cert_file, client_pair.key_file)
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("GET", "/v1/models")
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_openai_port_serves_https_with_the_same_files(
    small_repo: Path, pki: PKI, tmp_path: Path
) -> None:
    """[tls] covers the HTTP API too: the same certificate, client CA and reloads."""
    pytest.importorskip("starlette")
    import ssl

    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    cert.write_bytes(pki.server.cert_pem)
    key.write_bytes(pki.server.key_pem)
    srv = serve(
        small_repo,
        tls__cert_file=cert,
        tls__key_file=key,
        tls__client_ca_file=pki.ca.cert_file,
        openai__listen="127.0.0.1:0",
    )
    try:
        assert srv.server is not None and srv.server.openai is not None
        port = srv.server.openai.port
        assert _https_status(port, pki.ca.cert_file, pki.client) == 200
        for ca, pair in ((pki.ca.cert_file, None), (pki.ca.cert_file, pki.stranger)):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                _https_status(port, ca, pair)  # no client certificate, or one from elsewhere
        with pytest.raises(ssl.SSLCertVerificationError):
            _https_status(port, pki.other_ca.cert_file, pki.client)
        renewed = pki.other_ca.issue("tensord.test", server=True, stem="renewed-http")
        cert.write_bytes(renewed.cert_pem)
        key.write_bytes(renewed.key_pem)
        srv.server.security.reload()
        assert _https_status(port, pki.other_ca.cert_file, pki.client) == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            _https_status(port, pki.ca.cert_file, pki.client)
        with Client(srv.target, timeout=10, retries=0, tls=TLSOptions(
            pki.other_ca.cert_file, certificate_chain=pki.client.cert_file,
            private_key=pki.client.key_file,
        )) as c:  # fmt: skip
            assert dict(c.info().endpoints)["openai"] == f"https://127.0.0.1:{port}/v1"
    finally:
        srv.stop()
