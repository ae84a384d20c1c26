"""The watchdog on a real server: WATCHDOG=1 at half of WATCHDOG_USEC (1 s here) while the
gRPC server answers its Health probe, and none once the server stops answering, though the
event loop still runs."""

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
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
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
    assert watchdog.interval == pytest.approx(0.5)
    # The probe socket sits in a directory only this user can enter.
    directory = Path(watchdog.address.removeprefix("unix:")).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700

    listener.wait_for("READY", timeout=30)
    start = time.monotonic()
    pings = [m for m in listener.drain(2.6) if m == {"WATCHDOG": "1"}]
    elapsed = time.monotonic() - start
    # One every 0.5 s; allow for a slow machine but not for a silent or flooding watchdog.
    assert 3 <= len(pings) <= int(elapsed / 0.5) + 2
    assert watchdog.missed == 0

    # Stop only grpc's server core: the event loop (and the watchdog task) keep running,
    # but nothing answers the probe any more, so the keep-alives stop.
    watched.call(server._server.stop(None))
    listener.drain(0.75)  # a probe answered just before may still report
    missed_before = watchdog.missed
    assert [m for m in listener.drain(1.5) if "WATCHDOG" in m] == []
    assert watchdog.missed > missed_before
    assert not watched.loop.is_closed() and watchdog._task is not None
    assert not watchdog._task.done()
