"""The sd_notify client against a real unix datagram socket, path and abstract name."""

from __future__ import annotations

import os
import time

import pytest

from tensord.server.notify import (
    SystemdNotifier,
    monotonic_usec,
    socket_address,
    watchdog_interval,
)
from tests.notify_socket import NotifyListener


@pytest.mark.parametrize("abstract", [False, True])
def test_messages_arrive_as_one_datagram_each(abstract: bool) -> None:
    listener = NotifyListener(abstract=abstract)
    notifier = SystemdNotifier({"NOTIFY_SOCKET": listener.address})
    try:
        assert notifier.enabled
        assert notifier.status("loading models")
        assert notifier.ready("serving on port 5: 2 ready")
        before = monotonic_usec()
        assert notifier.reloading("reloading")
        assert notifier.watchdog()
        assert notifier.stopping("draining\nnow")
        got = [listener.receive(5) for _ in range(5)]
    finally:
        notifier.close()
        listener.close()
    assert got[0] == {"STATUS": "loading models"}
    assert got[1] == {"READY": "1", "STATUS": "serving on port 5: 2 ready"}
    assert got[2] is not None and got[2]["RELOADING"] == "1"
    assert before <= int(got[2]["MONOTONIC_USEC"]) <= monotonic_usec()
    assert got[3] == {"WATCHDOG": "1"}
    # A newline in a value would start a new field: it is flattened.
    assert got[4] == {"STOPPING": "1", "STATUS": "draining now"}


def test_monotonic_usec_is_clock_monotonic() -> None:
    assert abs(monotonic_usec() - time.monotonic_ns() // 1000) < 1_000_000


def test_without_a_manager_nothing_is_sent() -> None:
    notifier = SystemdNotifier({})
    assert not notifier.enabled
    assert not notifier.ready("x")


def test_a_vanished_socket_is_reported_not_raised() -> None:
    listener = NotifyListener()
    notifier = SystemdNotifier({"NOTIFY_SOCKET": listener.address})
    listener.close()
    assert notifier.enabled
    assert not notifier.status("nobody listens")
    assert not notifier.watchdog()


def test_socket_addresses() -> None:
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@abstract/name") == "\0abstract/name"
    assert socket_address("@") is None
    assert socket_address("vsock:2:1234") is None
    assert socket_address("relative/path") is None


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": str(os.getpid())}) == 0.2
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "abc"}) is None
    # Meant for another process (a parent that exec'd us without clearing it): not ours.
    assert watchdog_interval({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}) is None
