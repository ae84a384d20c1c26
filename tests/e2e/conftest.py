"""The daemon as a subprocess, started the way systemd starts it, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc


def free_port() -> int:
    """A port that was free a moment ago (the daemon binds it explicitly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    """A running `tensord serve` process."""

    process: subprocess.Popen[str]
    target: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

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


def start_daemon(repo: Path, log_path: Path, *extra: str) -> Daemon:
    """`python -m tensord.cli serve` on a fresh port, JSON logs to a file."""
    port = free_port()
    target = f"127.0.0.1:{port}"
    log_file = log_path.open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensord.cli",
            "serve",
            "--listen",
            target,
            "--model-repository",
            str(repo),
            "--log-format",
            "json",
            *extra,
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_serving(target)
    except TimeoutError:
        process.kill()
        raise AssertionError(f"daemon did not start; log:\n{log_path.read_text()}") from None
    return Daemon(process, target, log_path)


@pytest.fixture
def daemon(demo_repo: Path, tmp_path: Path) -> Iterator[Daemon]:
    """A daemon over the demo repository, for one test."""
    d = start_daemon(demo_repo, tmp_path / "tensord.log")
    yield d
    if d.process.poll() is None:
        d.process.kill()
        d.process.wait(10)
