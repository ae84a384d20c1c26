"""Faults and drains through a real server: a drain delay that answers UNAVAILABLE, a backend
failure that fails only its call, and a batch split in half when the device runs out of
memory (only when dimension 0 is a batch)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tensord.backends.base import Backend, DeviceOptions
from tensord.backends.onnxruntime import session_options
from tensord.config import load_config
from tensord.errors import InternalError, OutOfMemoryError
from tensord.modelconfig.model import ModelConfig
from tensord.registry.registry import BackendFactory, default_backend_factory
from tensord.v1 import inference_pb2 as pb
from tensord_client import Client
from tests.conftest import ServerThread, serve
from tests.models import WrappedBackend, build_slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
MARKER = 12345.0
"""A first input element that makes the faulty backend fail."""
OOM_ROWS = 2
"""More rows than this in one run and the memory-bound backend runs out of memory."""


def serve_with(repo: Path, factory: BackendFactory) -> ServerThread:
    """A server on a free loopback port over `repo` whose backends `factory` makes."""
    overrides = {"model_repository": str(repo), "server.listen": "127.0.0.1:0"}
    config = load_config(None, env={}, overrides=overrides)
    return ServerThread(config, backend_factory=factory).start()


def health_status(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return int(reply.status)


def reference(path: Path, x: np.ndarray) -> np.ndarray:
    """The model in-process, with the daemon's session options."""
    session = ort.InferenceSession(
        str(path), session_options(ModelConfig()), providers=["CPUExecutionProvider"]
    )
    (out,) = session.run(None, {"input": x})
    return np.asarray(out)


class FaultyBackend(WrappedBackend):
    """A real ONNX Runtime backend that fails, without poisoning anything, on the marker."""

    def __init__(self, inner: Backend, error: Exception) -> None:
        super().__init__(inner)
        self._error = error

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        if any(array.size and array.flat[0] == MARKER for array in inputs.values()):
            raise self._error
        return super().run(inputs, output_names)


class MemoryBoundBackend(WrappedBackend):
    """A real ONNX Runtime backend that runs out of memory above OOM_ROWS rows, and records
    the rows of every run it is given."""

    def __init__(self, inner: Backend, seen: list[int]) -> None:
        super().__init__(inner)
        self.seen = seen

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        rows = next(iter(inputs.values())).shape[0]
        self.seen.append(rows)
        if rows > OOM_ROWS:
            raise OutOfMemoryError(f"out of memory running the batch: {rows} rows")
        return super().run(inputs, output_names)


def test_drain_delay_answers_unavailable_before_the_server_stops(small_repo: Path) -> None:
    srv = serve(small_repo, server__drain_delay_seconds=1.0)
    assert health_status(srv.target) == SERVING
    took: list[float] = []

    def stop() -> None:
        start = time.monotonic()
        srv.stop()
        took.append(time.monotonic() - start)

    stopper = threading.Thread(target=stop, name="stop-server")
    stopper.start()
    try:
        deadline = time.monotonic() + 5
        while health_status(srv.target) != NOT_SERVING:
            assert time.monotonic() < deadline, "health never turned NOT_SERVING"
            time.sleep(0.01)
        with (
            Client(srv.target, timeout=5, retries=0) as client,
            pytest.raises(grpc.RpcError) as caught,
        ):
            client.predict("mlp", {"input": np.zeros((1, 512), np.float32)})
    finally:
        stopper.join(30)
    err = caught.value
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    # The data plane's answer, not a refused connection: the server still took the call.
    assert err.details() == "the server is starting or draining; retry shortly"
    assert took and took[0] >= 1.0


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            InternalError("ONNX Runtime run failed: a kernel failed"),
            "ONNX Runtime run failed: a kernel failed",
        ),
        (
            RuntimeError("an error no layer classified"),
            "internal error; the server log has the details under request id fault-1",
        ),
    ],
    ids=["internal-error", "unclassified"],
)
def test_a_backend_failure_fails_only_its_call(
    small_repo: Path, error: Exception, message: str
) -> None:
    def factory(path: Path, config: ModelConfig, where: DeviceOptions) -> Backend:
        backend = default_backend_factory(path, config, where)
        if path.parts[-3] == "mlp":
            return FaultyBackend(backend, error)
        return backend

    srv = serve_with(small_repo, factory)
    try:
        x = np.random.default_rng(3).normal(size=(2, 512)).astype(np.float32)
        bad = x.copy()
        bad[0, 0] = MARKER
        with Client(srv.target, timeout=10, retries=0) as client:
            with pytest.raises(grpc.RpcError) as caught:
                client.predict("mlp", {"input": bad}, request_id="fault-1")
            err = caught.value
            assert err.code() == grpc.StatusCode.INTERNAL
            assert err.details() == message
            assert ("x-request-id", "fault-1") in err.trailing_metadata()
            assert srv.server is not None and srv.server.exit_code == 0
            assert srv.server.dataplane.serving
            assert health_status(srv.target) == SERVING
            out = client.predict("mlp", {"input": x})["output"]
        expected = reference(small_repo / "mlp" / "1" / "model.onnx", x)
        assert out.tobytes() == expected.tobytes()
    finally:
        srv.stop()
    assert srv.server.exit_code == 0


@pytest.fixture
def oom_repo(small_repo: Path, tmp_path: Path) -> Path:
    """The mlp twice: `batched` (max_batch_size 32) and `whole` (max_batch_size 0)."""
    for name, max_batch_size in (("batched", 32), ("whole", 0)):
        (tmp_path / name / "1").mkdir(parents=True)
        shutil.copy(small_repo / "mlp" / "1" / "model.onnx", tmp_path / name / "1")
        (tmp_path / name / "model.toml").write_text(f"max_batch_size = {max_batch_size}\n")
    return tmp_path


def test_out_of_memory_splits_a_batch_but_not_a_whole_tensor(oom_repo: Path) -> None:
    seen: dict[str, list[int]] = {"batched": [], "whole": []}

    def factory(path: Path, config: ModelConfig, where: DeviceOptions) -> Backend:
        backend = default_backend_factory(path, config, where)
        return MemoryBoundBackend(backend, seen[path.parts[-3]])

    srv = serve_with(oom_repo, factory)
    rows = 4 * OOM_ROWS
    x = np.random.default_rng(11).normal(size=(rows, 512)).astype(np.float32)
    try:
        assert seen == {"batched": [1], "whole": [1]}  # the warm-up runs
        seen["batched"].clear()
        seen["whole"].clear()
        with Client(srv.target, timeout=10, retries=0) as client:
            out = client.predict("batched", {"input": x})["output"]
            with pytest.raises(grpc.RpcError) as caught:
                client.predict("whole", {"input": x})
    finally:
        srv.stop()
    # Halved until each part fits: 8 -> 4 + 4 -> 2 + 2 + 2 + 2, joined back in order.
    assert seen["batched"] == [8, 4, 2, 2, 4, 2, 2]
    model = oom_repo / "batched" / "1" / "model.onnx"
    expected = np.concatenate(
        [reference(model, x[i : i + OOM_ROWS]) for i in range(0, rows, OOM_ROWS)]
    )
    assert out.shape == (rows, 10)
    assert out.tobytes() == expected.tobytes()
    # Dimension 0 of a max_batch_size = 0 model is not a batch: its rows never run apart.
    assert seen["whole"] == [rows]
    err = caught.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == f"out of memory running the batch: {rows} rows"


def wait_for_executor(
    srv: ServerThread, model: str, ready: Callable[[pb.ExecutorStatus], bool], what: str
) -> None:
    """Poll Info until `model`'s executor status satisfies `ready`; fail with `what` after
    30 s."""
    with Client(srv.target, timeout=10, retries=0) as client:
        deadline = time.monotonic() + 30
        while True:
            (status,) = [m.executor_status for m in client.info().models if m.name == model]
            if ready(status):
                return
            assert time.monotonic() < deadline, what
            time.sleep(0.005)


def test_large_replies_finished_during_the_drain_arrive_whole(tmp_path: Path) -> None:
    """Calls that end during the drain get their whole reply, megabytes included: gRPC is
    stopped (and its connections closed) only after their handlers returned and a moment
    passed for the bytes to leave."""
    build_slow(tmp_path / "slow" / "1" / "model.onnx", layers=8)
    (tmp_path / "slow" / "model.toml").write_text("max_batch_size = 4096\ninstance_count = 2\n")
    srv = serve(tmp_path, server__max_send_message_bytes=64 * 1024 * 1024)
    x = np.full((4096, 1024), 0.01, np.float32)  # 16 MiB each way
    results: list[object] = []

    def call() -> None:
        with Client(srv.target, timeout=60, retries=0) as client:
            try:
                results.append(client.predict("slow", {"x": x})["y"].shape)
            except grpc.RpcError as exc:
                results.append(f"{exc.code().name}: {exc.details()}")

    calls = [threading.Thread(target=call) for _ in range(4)]
    for thread in calls:
        thread.start()
    # All four in the server: two running, two queued.
    wait_for_executor(
        srv, "slow", lambda s: s.running + s.queue_depth == 4, "the calls did not all arrive"
    )
    srv.stop(grace=30)
    for thread in calls:
        thread.join(60)
    assert results == [(4096, 1024)] * 4


def test_a_run_still_going_when_the_grace_ends_is_cut_short(tmp_path: Path) -> None:
    """The drain waits out its grace, then stops the model runs still in progress: the
    process is not held until a long run returns on its own."""
    # A name of its own: the shared test server's "slow" keeps lanes named cpu-slow_*.
    build_slow(tmp_path / "outlasting" / "1" / "model.onnx")
    (tmp_path / "outlasting" / "model.toml").write_text(
        "max_batch_size = 4096\ninstance_count = 1\n"
    )
    srv = serve(tmp_path, server__max_send_message_bytes=64 * 1024 * 1024)
    x = np.full((4096, 1024), 0.01, np.float32)  # 96 MatMuls at batch 4096: seconds a run
    outcome: list[grpc.StatusCode] = []

    def call() -> None:
        with Client(srv.target, timeout=120, retries=0) as client:
            try:
                client.predict("outlasting", {"x": x})
            except grpc.RpcError as exc:
                outcome.append(exc.code())

    caller = threading.Thread(target=call)
    caller.start()
    wait_for_executor(srv, "outlasting", lambda s: s.running > 0, "the call never started running")
    start = time.monotonic()
    srv.stop(grace=0.3)
    stopped_in = time.monotonic() - start
    deadline = time.monotonic() + 5
    while any(t.name.startswith("cpu-outlasting_") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the lane is still running the model"
        time.sleep(0.01)
    caller.join(30)
    assert stopped_in < 3.0
    assert outcome and outcome[0] in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
