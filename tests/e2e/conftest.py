"""The daemon as a subprocess, started the way systemd starts it, stopped with SIGTERM.

Every daemon listens on 127.0.0.1:0 and the test learns the port the kernel gave it from
the daemon itself (its "server.listening" log line, or its STATUS= line under systemd), so
no port is picked ahead and raced for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

LOOPBACK_ANY_PORT = "127.0.0.1:0"
"""A listen address whose port the kernel picks when the daemon binds it."""


def log_events(log_path: Path) -> list[dict[str, Any]]:
    """The JSON log lines written so far (a line still being written is left out)."""
    events = []
    # errors="replace": gRPC's own log lines may quote the raw bytes of a hostile frame.
    for line in log_path.read_text(errors="replace").splitlines(keepends=True):
        if line.startswith("{") and line.endswith("\n"):
            events.append(json.loads(line))
    return events


def wait_for_event(
    log_path: Path, event: str, process: subprocess.Popen[Any], timeout: float = 60
) -> dict[str, Any]:
    """The first JSON log line whose "event" is `event`, once the daemon has written it."""
    deadline = time.monotonic() + timeout
    while True:
        found = next((e for e in log_events(log_path) if e.get("event") == event), None)
        if found is not None:
            return found
        if process.poll() is not None:
            raise AssertionError(
                f"daemon exited {process.returncode} before {event!r}; log:\n{log_path.read_text()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no {event!r} in {timeout}s; log:\n{log_path.read_text()}")
        time.sleep(0.05)


def listening_port(log_path: Path, process: subprocess.Popen[Any], timeout: float = 60) -> int:
    """The gRPC port the daemon bound, from its "server.listening" log line."""
    port = int(wait_for_event(log_path, "server.listening", process, timeout)["port"])
    assert port > 0, port
    return port


@dataclass
class Daemon:
    """A running `tensord serve` process."""

    process: subprocess.Popen[str]
    target: str
    log_path: Path

    @property
    def port(self) -> int:
        return int(self.target.rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text()

    def event(self, name: str, timeout: float = 60) -> dict[str, Any]:
        """The daemon's first JSON log line with "event": `name` (waiting for it)."""
        return wait_for_event(self.log_path, name, self.process, timeout)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, then wait for the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def wait_serving(target: str, timeout: float = 60) -> None:
    """Poll grpc.health.v1 until the overall status is SERVING."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"tensord at {target} did not become SERVING in {timeout}s")


def spawn_daemon(repo: Path, log_path: Path, *extra: str) -> subprocess.Popen[str]:
    """`python -m tensord.cli serve` on 127.0.0.1:0, JSON logs to a file; not waited for."""
    with log_path.open("w") as log_file:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensord.cli",
                "serve",
                "--listen",
                LOOPBACK_ANY_PORT,
                "--model-repository",
                str(repo),
                "--log-format",
                "json",
                *extra,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **_frontends()},
        )


def _frontends() -> dict[str, str]:
    """In the frontends tier (TENSORD_TEST_FRONTENDS=N), the daemon runs N frontends."""
    from tests.conftest import FRONTENDS

    return {"TENSORD_SERVER_FRONTENDS": str(FRONTENDS)} if FRONTENDS else {}


def start_daemon(repo: Path, log_path: Path, *extra: str) -> Daemon:
    """A daemon serving `repo` (spawn_daemon), once health says SERVING; the port comes
    from its "server.listening" line."""
    process = spawn_daemon(repo, log_path, *extra)
    try:
        target = f"127.0.0.1:{listening_port(log_path, process)}"
        try:
            wait_serving(target)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; log:\n{log_path.read_text()}") from None
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        raise
    return Daemon(process, target, log_path)


@pytest.fixture
def daemon(demo_repo: Path, tmp_path: Path) -> Iterator[Daemon]:
    """A daemon over the demo repository, for one test."""
    d = start_daemon(demo_repo, tmp_path / "tensord.log")
    yield d
    if d.process.poll() is None:
        d.process.kill()
        d.process.wait(10)
