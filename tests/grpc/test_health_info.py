"""Health, grpc.health.v1 and Info agree with the registry; a broken model is reported."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tensord.v1 import inference_pb2 as pb
from tensord_client import Client, ModelState, NotFound, ServingStatus
from tests.conftest import ServerThread, serve

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_lists_every_version(client: Client) -> None:
    reply = client.health()
    assert reply.status is ServingStatus.SERVING and reply.status == "SERVING" and reply.serving
    states = {(m.name, m.version): m.state for m in reply.models}
    assert states[("mlp", 1)] == "READY"
    assert states[("versioned", 1)] is states[("versioned", 2)] is ModelState.READY
    assert states[("broken", 1)] is ModelState.FAILED
    # The protobuf message is there too, and the names still equal the wire numbers.
    assert reply.proto.status == pb.SERVING_STATUS_SERVING == reply.status
    assert states[("broken", 1)] == pb.MODEL_STATE_FAILED


def test_health_of_one_model(client: Client) -> None:
    (broken,) = client.health("broken").models
    assert broken.state == "FAILED"
    assert broken.reason.startswith("ONNX Runtime cannot load")
    assert "broken/1/model.onnx" in broken.reason
    with pytest.raises(NotFound) as info:
        client.health("nope")
    assert isinstance(info.value, grpc.RpcError)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert str(info.value) == f"NOT_FOUND: {info.value.details()}"


@pytest.mark.parametrize(
    ("service", "status"),
    [
        ("", SERVING),
        ("tensord.v1.InferenceService", SERVING),
        ("tensord.model.mlp", SERVING),
        ("tensord.model.broken", NOT_SERVING),
    ],
)
def test_standard_health_service(server: ServerThread, service: str, status: int) -> None:
    with grpc.insecure_channel(server.target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service)
        )
    assert reply.status == status


def test_standard_health_unknown_service(server: ServerThread) -> None:
    with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="tensord.model.nope")
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.in_process  # the test server's own asyncio loop
def test_info(client: Client) -> None:
    import onnxruntime

    reply = client.info()
    assert reply.server_version == "0.1.0"
    assert reply.runtime.onnxruntime == onnxruntime.__version__
    assert reply.runtime.grpcio == grpc.__version__
    assert reply.runtime.event_loop == "asyncio"  # the test server runs on its own asyncio loop
    assert reply.cpu.logical_cores >= 1 and reply.cpu.architecture
    assert "CPUExecutionProvider" in reply.available_providers
    if not reply.gpus:
        assert reply.gpu_unavailable_reason
    mlp = next(m for m in reply.models if m.name == "mlp")
    assert mlp.state == "READY"
    assert (mlp.backend, mlp.executor, mlp.kind) == ("onnxruntime", "cpu", "predict")
    assert mlp.provider == mlp.requested_providers[0]
    assert mlp.provider_reason
    assert mlp.max_batch_size == 128
    assert [(s.name, s.dtype, s.shape) for s in mlp.inputs] == [("input", "FLOAT32", [-1, 512])]
    assert [(s.name, s.dtype, s.shape) for s in mlp.outputs] == [("output", "FLOAT32", [-1, 10])]
    assert mlp.inputs[0].numpy_dtype == np.float32
    assert mlp.load_time_ms > 0
    broken = next(m for m in reply.models if m.name == "broken")
    assert broken.state == "FAILED" and broken.reason
    endpoints = dict(reply.endpoints)
    assert {
        "tensord.v1.InferenceService", "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= set(endpoints)  # fmt: skip
    address = endpoints["tensord.v1.InferenceService"]
    assert address.startswith("127.0.0.1:") and int(address.rsplit(":", 1)[1]) > 0
    assert set(endpoints.values()) == {address}


def test_info_reports_executor_and_batching(client: Client) -> None:
    client.predict("mlp_batched", {"input": np.zeros((3, 512), np.float32)})
    info = {(m.name, m.version): m for m in client.info().models}
    batched = info[("mlp_batched", 1)]
    # instance_count is unset in its model.toml: on the CPU one batch runs at a time, on
    # one lane (the model without batching keeps the default two).
    assert batched.instance_count == 1 and info[("mlp", 1)].instance_count == 2
    assert batched.dynamic_batching.concurrent_batches == 1
    assert list(batched.dynamic_batching.preferred_batch_size) == [16, 32]
    assert batched.dynamic_batching.max_queue_delay_microseconds == 2000
    assert batched.dynamic_batching.requests >= 1 and batched.dynamic_batching.rows >= 3
    status = batched.executor_status
    assert status.kind == "cpu" == batched.executor
    assert (
        status.reason
        == "the model runs on CPUExecutionProvider, so its batches stay in host memory"
    )
    assert [lane.index for lane in status.lanes] == [0]
    assert [lane.index for lane in info[("mlp", 1)].executor_status.lanes] == [0, 1]
    assert sum(lane.runs for lane in status.lanes) >= 1  # warm-up runs directly, not on a lane
    host = next(p for p in status.pools if p.name == "host")
    assert host.in_use_bytes == 0
    assert not info[("mlp", 1)].proto.HasField("dynamic_batching")


def test_info_says_whether_tensorrt_is_here(client: Client) -> None:
    from tensord.backends.tensorrt import tensorrt_status

    available, why = tensorrt_status()
    assert client.info().tensorrt == why
    if not available:
        assert why.startswith("the tensorrt Python package is not usable here (")


def test_an_explicit_instance_count_runs_that_many_batches(
    small_repo: Path, tmp_path: Path
) -> None:
    """instance_count set in model.toml is honoured by the batcher on the CPU too."""
    import shutil

    shutil.copytree(small_repo / "mlp", tmp_path / "mlp")
    (tmp_path / "mlp" / "model.toml").write_text(
        "max_batch_size = 32\ninstance_count = 3\n[dynamic_batching]\n"
    )
    srv = serve(tmp_path)
    try:
        with Client(srv.target) as c:
            (mlp,) = [m for m in c.info().models if m.name == "mlp"]
    finally:
        srv.stop()
    assert mlp.instance_count == 3 and mlp.dynamic_batching.concurrent_batches == 3
    assert len(mlp.executor_status.lanes) == 3


def test_watch_streams_hear_not_serving_and_do_not_hold_the_drain(small_repo: Path) -> None:
    import threading
    import time

    srv = serve(small_repo)
    heard: list[int] = []
    ended: list[grpc.StatusCode] = []
    with grpc.insecure_channel(srv.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)

        def read() -> None:
            for reply in stream:
                heard.append(reply.status)
            ended.append(stream.code())

        reader = threading.Thread(target=read)
        reader.start()
        while not heard:
            time.sleep(0.01)
        start = time.monotonic()
        srv.stop(grace=20)
        took = time.monotonic() - start
        reader.join(10)
    assert heard == [
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    ]
    assert ended == [grpc.StatusCode.OK]
    assert took < 5  # not the 20 s grace
