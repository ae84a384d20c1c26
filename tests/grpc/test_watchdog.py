"""The watchdog on a real server: WATCHDOG=1 at half of WATCHDOG_USEC (2 s here) while the
gRPC server answers its Health probe, and none once the server stops answering, though the
event loop still runs. Each probe has half the interval, 0.5 s, to be answered: a server in
the test's own process, on a loaded host, can take a few hundred ms."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerThread, start_server
from tests.notify_socket import NotifyListener


@pytest.fixture
def listener() -> Iterator[NotifyListener]:
    sock = NotifyListener(abstract=True)
    yield sock
    sock.close()


@pytest.fixture
def watched(
    demo_repo: Path, listener: NotifyListener, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ServerThread]:
    monkeypatch.setenv("NOTIFY_SOCKET", listener.address)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    srv = start_server(demo_repo)
    yield srv
    if srv.server is not None and srv.server.watchdog is not None:
        srv.server.watchdog.close()
    srv.stop(grace=0)


def test_keepalives_follow_answers(watched: ServerThread, listener: NotifyListener) -> None:
    server = watched.server
    assert server is not None and server.watchdog is not None
    watchdog = server.watchdog
    assert watchdog.interval == pytest.approx(1.0)
    assert watchdog.probe_timeout == pytest.approx(0.5)
    # The probe socket sits in a directory only this user can enter.
    directory = Path(watchdog.address.removeprefix("unix:")).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700

    listener.wait_for("READY", timeout=30)
    start = time.monotonic()
    pings = [m for m in listener.drain(2.6) if m == {"WATCHDOG": "1"}]
    elapsed = time.monotonic() - start
    # One a second; allow for a slow machine but not for a silent or flooding watchdog.
    assert 2 <= len(pings) <= int(elapsed / 1.0) + 2
    assert watchdog.missed == 0

    # Stop only grpc's server core: the event loop (and the watchdog task) keep running,
    # but nothing answers the probe any more, so the keep-alives stop.
    watched.call(server._server.stop(None))
    listener.drain(0.75)  # a probe answered just before may still report
    missed_before = watchdog.missed
    assert [m for m in listener.drain(2.0) if "WATCHDOG" in m] == []
    assert watchdog.missed > missed_before
    assert not watched.loop.is_closed() and watchdog._task is not None
    assert not watchdog._task.done()


def test_probes_pass_closed_health_and_are_not_counted(
    small_repo: Path,
    tmp_path: Path,
    listener: NotifyListener,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a token needed for Health too, the daemon's own probe is neither a failed login
    nor a client call in the metrics."""
    from tensord_client import Client
    from tests.conftest import serve
    from tests.grpc.test_auth import ADMIN, write_tokens
    from tests.grpc.test_metrics import samples, scrape

    monkeypatch.setenv("NOTIFY_SOCKET", listener.address)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    tokens = write_tokens(tmp_path / "tokens.toml")
    srv = serve(
        small_repo,
        auth__token_file=tokens,
        auth__open_health=False,
        metrics__listen="127.0.0.1:0",
    )
    try:
        server = srv.server
        assert server is not None and server.watchdog is not None
        listener.wait_for("READY", timeout=30)
        # Three probes in 1.5 s, each given 0.25 s. `missed` counts only slow answers (a
        # probe refused by auth would count as answered): the metrics below show it passed.
        pings = [m for m in listener.drain(1.5) if m == {"WATCHDOG": "1"}]
        assert len(pings) >= 2
        port = server.observability.port
        assert port
        health_calls = {
            labels: v
            for (name, labels), v in samples(scrape(port)).items()
            if name == "tensord_requests_total" and ("rpc", "Health") in labels
        }
        assert health_calls == {}  # no UNAUTHENTICATED, and no OK either: not a client
        with Client(srv.target, timeout=10, retries=0, token=ADMIN) as client:
            client.health()  # a client's call is counted
        counted = {
            dict(labels)["code"]: v
            for (name, labels), v in samples(scrape(port)).items()
            if name == "tensord_requests_total" and ("rpc", "Health") in labels
        }
        assert counted == {"OK": 1.0}
    finally:
        if srv.server is not None and srv.server.watchdog is not None:
            srv.server.watchdog.close()
        srv.stop(grace=0)
