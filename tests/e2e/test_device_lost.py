"""A sticky CUDA error in a real daemon process: the request fails INTERNAL, health turns
NOT_SERVING at once, calls in flight on other models still finish, systemd is told
STOPPING=1, and the process exits 75 so that Restart=on-failure starts a fresh one."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto

from tensord.server.app import EXIT_DEVICE_LOST
from tensord_client import Client
from tests.e2e.conftest import LOOPBACK_ANY_PORT, listening_port, log_events, wait_serving
from tests.models import build_identity, build_slow
from tests.notify_socket import NotifyListener
from tests.tools import ROOT

pytestmark = pytest.mark.e2e


def running(client: Client, model: str) -> int:
    """Runs executing now on `model`'s executor, from Info."""
    return next(m.executor_status.running for m in client.info().models if m.name == model)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    build_identity(root / "faulty" / "1" / "model.onnx", TensorProto.FLOAT)
    build_slow(root / "slow" / "1" / "model.onnx", layers=48)
    (root / "slow" / "model.toml").write_text("max_batch_size = 2048\ninstance_count = 1\n")
    return root


def serve(repo: Path, log_path: Path, listener: NotifyListener) -> subprocess.Popen[bytes]:
    """The daemon whose `faulty` model loses the device on a call with -999 in its input."""
    argv = [sys.executable, "-m", "tests.e2e.device_lost_daemon", "--listen", LOOPBACK_ANY_PORT]
    argv += ["--model-repository", str(repo), "--log-format", "json"]
    with log_path.open("w") as log:
        env = listener.env(PYTHONUNBUFFERED="1")
        return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)


def slow_call(target: str) -> tuple[threading.Thread, dict[str, object]]:
    """A call of about 2 s on `slow`, on a thread of its own; the dict gets its output's
    shape and when it came (or its error)."""
    result: dict[str, object] = {}

    def call() -> None:
        with Client(target, timeout=60, retries=0) as client:
            x = np.full((2048, 1024), 0.01, np.float32)  # about 2 s of work
            try:
                result["shape"] = client.predict("slow", {"x": x})["y"].shape
                result["done"] = time.monotonic()
            except grpc.RpcError as exc:
                result["error"] = f"{exc.code().name}: {exc.details()}"

    thread = threading.Thread(target=call)
    thread.start()
    return thread, result


def lose_the_device(target: str) -> grpc.RpcError:
    """Once the slow call is on its lane: a good call to `faulty`, then the one that loses
    the device; returns that one's error."""
    with Client(target, timeout=10, retries=0) as client:
        deadline = time.monotonic() + 30
        while running(client, "slow") == 0:  # the slow call is on its lane
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert client.predict("faulty", {"x": np.zeros((1, 4), np.float32)})["y"].shape
        with pytest.raises(grpc.RpcError) as failed:
            client.predict("faulty", {"x": np.full((1, 4), -999.0, np.float32)})
    return failed.value


def assert_not_serving(target: str) -> None:
    """NOT_SERVING while the slow call drains (or already gone)."""
    with grpc.insecure_channel(target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        try:
            answer = check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAVAILABLE


def test_sticky_cuda_error_drains_and_exits_non_zero(repo: Path, tmp_path: Path) -> None:
    listener = NotifyListener()
    log_path = tmp_path / "tensord.log"
    process = serve(repo, log_path, listener)
    try:
        target = f"127.0.0.1:{listening_port(log_path, process)}"
        wait_serving(target)
        listener.wait_for("READY")
        slow, slow_result = slow_call(target)
        failed = lose_the_device(target)
        assert failed.code() is grpc.StatusCode.INTERNAL
        assert "cudaErrorIllegalAddress" in (failed.details() or "")

        status = listener.wait_for("STOPPING", timeout=10)
        stopping_at = time.monotonic()
        assert status["STATUS"].startswith("draining")
        assert_not_serving(target)
        assert process.wait(60) == EXIT_DEVICE_LOST
        slow.join(30)
        # The call in flight on another model finished during the drain.
        assert slow_result.get("shape") == (2048, 1024), slow_result
        assert slow_result["done"] > stopping_at  # type: ignore[operator]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        listener.close()
    statuses = [m.get("STATUS", "") for m in listener.messages]
    lost_status = "device lost, restarting: cudaStreamSynchronize failed"
    assert any(s.startswith(lost_status) for s in statuses)
    events = log_events(log_path)
    lost = next(e for e in events if e["event"] == "device.lost")
    assert lost["level"] == "critical" and lost["exit_code"] == EXIT_DEVICE_LOST
    stopped = next(e for e in events if e["event"] == "server.stopped")
    assert stopped["exit_code"] == EXIT_DEVICE_LOST
