"""Honest readiness through a real server: health says NOT_SERVING while no model (or a
required one) can serve, follows reloads, and systemd still hears READY=1 and keep-alives;
a model that failed to load answers FAILED_PRECONDITION."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto

from tensord.config import TensordConfig, load_config
from tensord.v1 import inference_pb2 as pb
from tensord_client import Client
from tests.conftest import ServerThread, serve
from tests.models import build_identity
from tests.notify_socket import NotifyListener

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVER_SERVICES = ("", "tensord.v1.InferenceService")
X = np.ones((1, 4), np.float32)


def statuses(target: str, *services: str) -> list[int]:
    """grpc.health.v1 Check of each service."""
    with grpc.insecure_channel(target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        return [
            int(check(health_pb2.HealthCheckRequest(service=s), timeout=5).status) for s in services
        ]


def failing_repository(root: Path) -> Path:
    """Three models that cannot load: not ONNX, an empty file, a model.toml that is not
    TOML."""
    for name, data in (("garbage", b"this is not an ONNX file"), ("empty", b"")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(data)
    build_identity(root / "badtoml" / "1" / "model.onnx", TensorProto.FLOAT)
    (root / "badtoml" / "model.toml").write_text("max_batch_size = \n")
    return root


@pytest.fixture
def listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifyListener]:
    """systemd's side of the notify protocol, with a watchdog every second (each probe
    given 0.5 s: an in-process server on a loaded host can take a few hundred ms)."""
    sock = NotifyListener(abstract=True)
    monkeypatch.setenv("NOTIFY_SOCKET", sock.address)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    yield sock
    sock.close()


@pytest.mark.in_process  # reaches into the server object
def test_no_model_ready_is_not_serving_until_a_reload_brings_one(
    tmp_path: Path, listener: NotifyListener
) -> None:
    repo = failing_repository(tmp_path / "models")
    srv = serve(repo)
    try:
        assert srv.server is not None
        # Started: systemd hears READY=1 (so `systemctl reload` is allowed), and why not.
        ready = listener.wait_for("READY", timeout=30)
        assert ready["STATUS"] == (
            f"not serving (no model is READY: 3 FAILED) on port {srv.port}: 3 failed"
        )
        assert statuses(srv.target, *SERVER_SERVICES, "tensord.model.garbage") == [NOT_SERVING] * 3
        with Client(srv.target, timeout=10, retries=0) as client:
            reply = client.health()
            assert reply.status == pb.SERVING_STATUS_NOT_SERVING
            assert [(m.name, m.state) for m in reply.models] == [
                ("badtoml", pb.MODEL_STATE_FAILED),
                ("empty", pb.MODEL_STATE_FAILED),
                ("garbage", pb.MODEL_STATE_FAILED),
            ]
            with pytest.raises(grpc.RpcError) as caught:
                client.predict("garbage", {"x": X})
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert caught.value.details().startswith("model 'garbage' version 1 is FAILED: ")
        # The watchdog's probe is answered (NOT_SERVING is an answer): keep-alives go on.
        pings = [m for m in listener.drain(1.6) if m == {"WATCHDOG": "1"}]
        assert pings and srv.server.watchdog is not None and srv.server.watchdog.missed == 0

        heard: list[int] = []
        with grpc.insecure_channel(srv.target) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=30
            )

            def read() -> None:
                for reply in watch:
                    heard.append(reply.status)
                    if reply.status == SERVING:
                        return

            reader = threading.Thread(target=read)
            reader.start()
            deadline = time.monotonic() + 10
            while not heard and time.monotonic() < deadline:  # the Watch has begun
                time.sleep(0.01)
            build_identity(repo / "good" / "1" / "model.onnx", TensorProto.FLOAT)
            result = srv.call(srv.server.reload())
            assert result.models is not None and result.models.added == ["good v1"]
            assert statuses(srv.target, *SERVER_SERVICES) == [SERVING, SERVING]
            reloaded = listener.wait_for("READY", timeout=30)
            assert reloaded["STATUS"].startswith(f"serving on port {srv.port}: 1 ready, 3 failed")
            reader.join(10)
            watch.cancel()
        assert heard == [NOT_SERVING, SERVING]
        with Client(srv.target, timeout=10, retries=0) as client:
            assert client.health().status == pb.SERVING_STATUS_SERVING
            assert client.predict("good", {"x": X})["y"].tolist() == X.tolist()
    finally:
        if srv.server is not None and srv.server.watchdog is not None:
            srv.server.watchdog.close()
        srv.stop(grace=0)


@pytest.mark.in_process  # reaches into the server object
def test_a_required_model_that_fails_makes_the_daemon_not_serving(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    build_identity(repo / "good" / "1" / "model.onnx", TensorProto.FLOAT)
    (repo / "needed" / "1").mkdir(parents=True)
    (repo / "needed" / "1" / "model.onnx").write_bytes(b"not onnx")
    (repo / "needed" / "model.toml").write_text("required = true\n")
    srv = serve(repo)
    try:
        assert srv.server is not None
        assert statuses(srv.target, *SERVER_SERVICES) == [NOT_SERVING, NOT_SERVING]
        # The other model serves, and its own service says so.
        assert statuses(srv.target, "tensord.model.good") == [SERVING]
        assert srv.server.status_line().startswith(
            "not serving (required model 'needed' (FAILED) is not READY)"
        )
        with Client(srv.target, timeout=10, retries=0) as client:
            assert client.predict("good", {"x": X})["y"].tolist() == X.tolist()

        (repo / "needed" / "model.toml").write_text("required = false\n")
        srv.call(srv.server.reload())
        assert statuses(srv.target, *SERVER_SERVICES) == [SERVING, SERVING]

        # Marking a served model required applies without loading it again.
        (repo / "good" / "model.toml").write_text("required = true\n")
        loaded = srv.server.registry.get("good")
        result = srv.call(srv.server.reload())
        assert result.models is not None and result.models.changed == []
        assert srv.server.registry.get("good") is loaded and loaded.config.required
        assert statuses(srv.target, *SERVER_SERVICES) == [SERVING, SERVING]
    finally:
        srv.stop()


def test_ready_when_always_keeps_the_old_behaviour_and_a_reload_changes_it(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "models"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    policy = ["always"]

    def config() -> TensordConfig:
        overrides = {
            "model_repository": str(repo),
            "server.listen": "127.0.0.1:0",
            "server.ready_when": policy[0],
        }
        return load_config(None, env={}, overrides=overrides)

    srv = ServerThread(config(), config_loader=config).start()
    try:
        assert srv.server is not None
        # "always": SERVING once started, though nothing can serve.
        assert statuses(srv.target, *SERVER_SERVICES) == [SERVING, SERVING]
        with Client(srv.target, timeout=10, retries=0) as client:
            assert client.health().status == pb.SERVING_STATUS_SERVING

        build_identity(repo / "good" / "1" / "model.onnx", TensorProto.FLOAT)
        policy[0] = "all_models"
        result = srv.call(srv.server.reload())
        assert result.ignored == {}  # a live setting
        assert statuses(srv.target, *SERVER_SERVICES) == [NOT_SERVING, NOT_SERVING]
        assert "model 'broken' (FAILED) is not READY (ready_when = all_models)" in (
            srv.server.status_line()
        )

        policy[0] = "any_model"
        srv.call(srv.server.reload())
        assert statuses(srv.target, *SERVER_SERVICES) == [SERVING, SERVING]
    finally:
        srv.stop()
