"""The CUDA executor with a device backend made of an NVRTC kernel (no onnxruntime-gpu):
lanes, pooled pinned and device buffers, copies overlapping compute on the device's own
clock, and a CUDA out-of-memory error that fails only its request."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def run_batches(executor: Any, batches: list[list[dict[str, np.ndarray]]]) -> list[np.ndarray]:
    """Every batch at once through the executor; the first output of each."""

    async def go() -> list[np.ndarray]:
        results = await asyncio.gather(*(executor.run(parts, ["y"]) for parts in batches))
        return [r.outputs[0] for r in results]

    return asyncio.run(go())


def test_lanes_join_copy_and_reuse_their_buffers() -> None:
    from tensord.executor.cuda.executor import CudaExecutor
    from tests.gpu.kernel_backend import KernelBackend, expected

    backends: list[KernelBackend] = []

    def make(stream: int) -> KernelBackend:
        backends.append(KernelBackend(stream))
        return backends[-1]

    executor = CudaExecutor("affine", make, 2)
    try:
        assert executor.stats().kind == "cuda" and len(backends) == 2
        rng = np.random.default_rng(0)
        batches = [
            [{"x": rng.normal(size=(rows, 1000)).astype(np.float32)} for rows in (1, 7, 32)]
            for _ in range(6)
        ]
        for parts, out in zip(batches, run_batches(executor, batches), strict=True):
            joined = np.concatenate([p["x"] for p in parts])
            assert out.shape == joined.shape and out.tobytes() == expected(joined).tobytes()
        before = executor.stats().pools
        outs = run_batches(executor, batches)  # the same sizes again: buffers reused
        after = executor.stats().pools
        assert outs[0].tobytes() == expected(np.concatenate([p["x"] for p in batches[0]])).tobytes()
        # Never more buffers than two lanes hold at once: a pinned input and output each,
        # a device input each (the backend's outputs come from its own pool).
        for name, most in (("pinned", 4), ("device", 2)):
            assert after[name].allocations <= most, (name, after[name])
            assert after[name].reuses > before[name].reuses, name
            assert after[name].in_use_bytes == 0, name
        assert all(b.pool.stats().in_use_bytes == 0 for b in backends)  # outputs released
        empty = run_batches(executor, [[{"x": np.zeros((0, 1000), np.float32)}]])
        assert empty[0].shape == (0, 1000)
    finally:
        executor.close()


def spin_for(ms: float, count: int) -> int:
    """Spin rounds that make the kernel over `count` floats take at least `ms` ms."""
    from cuda.bindings import runtime as cudart

    from tensord.cuda.runtime import check
    from tests.gpu.kernel_backend import elapsed_ms, kernel_function, launch

    function = kernel_function(0)
    stream = check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "stream")
    buffer = check(cudart.cudaMalloc(count * 4), "cudaMalloc")
    events = [check(cudart.cudaEventCreate(), "cudaEventCreate") for _ in range(2)]
    spin = 256
    try:
        launch(function, int(buffer), int(buffer), count, 1 << 16, int(stream))  # clocks up
        check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        while True:
            check(cudart.cudaEventRecord(events[0], stream), "cudaEventRecord")
            launch(function, int(buffer), int(buffer), count, spin, int(stream))
            check(cudart.cudaEventRecord(events[1], stream), "cudaEventRecord")
            check(cudart.cudaEventSynchronize(events[1]), "cudaEventSynchronize")
            took = elapsed_ms(events[0], events[1])
            if took >= ms or spin >= 1 << 24:
                return max(1, int(spin * ms / took) + 1)
            spin *= 2
    finally:
        for event in events:
            cudart.cudaEventDestroy(event)
        cudart.cudaFree(buffer)
        cudart.cudaStreamDestroy(stream)


@pytest.mark.parametrize("lanes", [1, 2])
def test_copies_overlap_compute_only_across_lanes(lanes: int) -> None:
    """Two batches at once. With two lanes, one batch's upload finishes while the other's
    kernel runs (their spans overlap on the device's clock); with one lane they cannot.
    Nothing on the hot path may synchronise the device (cudaFree, a blocking stream)."""
    from cuda.bindings import runtime as cudart

    from tensord.cuda.runtime import check
    from tensord.executor.cuda.executor import CudaExecutor
    from tests.gpu.kernel_backend import KernelBackend, elapsed_ms, expected

    count = 4 * MIB // 4  # 4 MiB per batch: copies of well under a millisecond
    spin = spin_for(50.0, count)
    backends: list[KernelBackend] = []

    def make(stream: int) -> KernelBackend:
        backends.append(KernelBackend(stream, spin=spin, record=True))
        return backends[-1]

    executor = CudaExecutor("spin", make, lanes)
    origin = check(cudart.cudaEventCreate(), "cudaEventCreate")
    try:
        x = np.random.default_rng(1).normal(size=(1, count)).astype(np.float32)
        run_batches(executor, [[{"x": x}] for _ in range(lanes)])  # buffers pooled now
        for backend in backends:
            backend.clear_spans()  # the warm-up's
        check(cudart.cudaEventRecord(origin, 0), "cudaEventRecord")
        check(cudart.cudaEventSynchronize(origin), "cudaEventSynchronize")
        outs = run_batches(executor, [[{"x": x}], [{"x": x}]])
        assert all(out.tobytes() == expected(x).tobytes() for out in outs)
        spans = [span for backend in backends for span in backend.spans]
        assert len(spans) == 2
        ready = [elapsed_ms(origin, s.ready) for s in spans]
        done = [elapsed_ms(origin, s.done) for s in spans]
        kernel_ms = min(d - r for r, d in zip(ready, done, strict=True))
        assert kernel_ms >= 25.0, f"the kernel took {kernel_ms:.1f} ms, too short to tell"
        overlap = min(done) - max(ready)
        if lanes == 2:
            assert len({s.stream for s in spans}) == 2
            assert overlap > 0.5 * kernel_ms, (ready, done)
        else:
            assert overlap <= 0.0, (ready, done)
    finally:
        cudart.cudaEventDestroy(origin)
        executor.close()


@pytest.fixture
def kernel_repo(demo_repo: Path, tmp_path: Path) -> Path:
    """One model, `affine`, whose backend is the NVRTC kernel (its ONNX file is unread)."""
    (tmp_path / "affine" / "1").mkdir(parents=True)
    shutil.copy(demo_repo / "mlp" / "1" / "model.onnx", tmp_path / "affine" / "1")
    (tmp_path / "affine" / "model.toml").write_text("max_batch_size = 0\n")
    return tmp_path


class DeviceHog:
    """Device memory taken in chunks until only about `leave` bytes are free."""

    def __init__(self, leave: int) -> None:
        from cuda.bindings import runtime as cudart

        from tensord.cuda.runtime import check

        self.pointers: list[int] = []
        chunk = 1 << 30
        while chunk >= MIB:
            free, _ = check(cudart.cudaMemGetInfo(), "cudaMemGetInfo")
            if free - chunk < leave:
                chunk //= 2
                continue
            error, ptr = cudart.cudaMalloc(chunk)
            if error != cudart.cudaError_t.cudaSuccess:
                chunk //= 2
                continue
            self.pointers.append(int(ptr))
        self.free = int(check(cudart.cudaMemGetInfo(), "cudaMemGetInfo")[0])

    def release(self) -> None:
        from cuda.bindings import runtime as cudart

        for ptr in self.pointers:
            cudart.cudaFree(ptr)
        self.pointers.clear()


@pytest.fixture
def kernel_server(kernel_repo: Path) -> Iterator[Any]:
    from tensord.config import load_config
    from tests.conftest import ServerThread
    from tests.gpu.kernel_backend import KernelBackend

    def factory(path: Path, config: Any, where: Any) -> KernelBackend:
        return KernelBackend(where.cuda_stream or 0, device_id=where.device_id)

    overrides = {
        "model_repository": str(kernel_repo),
        "server.listen": "127.0.0.1:0",
        "server.max_receive_message_bytes": 512 * MIB,
        "server.max_send_message_bytes": 512 * MIB,
    }
    srv = ServerThread(load_config(None, env={}, overrides=overrides), backend_factory=factory)
    srv.start()
    yield srv
    srv.stop()


def test_cuda_out_of_memory_fails_only_its_request(kernel_server: Any) -> None:
    from tensord.v1 import inference_pb2 as pb
    from tensord_client import Client
    from tests.gpu.kernel_backend import expected

    rng = np.random.default_rng(2)
    big = rng.normal(size=(1, 128 * MIB // 4)).astype(np.float32)  # 128 MiB in, 128 out
    small = rng.normal(size=(4, 1024)).astype(np.float32)
    with Client(kernel_server.target, timeout=120, retries=0) as client:
        (model,) = [m for m in client.info().models if m.name == "affine"]
        assert model.state == pb.MODEL_STATE_READY, model.reason
        assert model.executor == "cuda", model.executor_status.reason
        assert client.predict("affine", {"x": small})["y"].tobytes() == expected(small).tobytes()
        hog = DeviceHog(leave=64 * MIB)
        try:
            assert hog.free < 128 * MIB, f"{hog.free} bytes still free"
            with pytest.raises(grpc.RpcError) as caught:
                client.predict("affine", {"x": big})
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (caught.value.details() or "").startswith("out of GPU memory: 128.0 MiB")
            for _ in range(3):  # the daemon goes on serving what fits
                out = client.predict("affine", {"x": small})["y"]
                assert out.tobytes() == expected(small).tobytes()
            assert client.health().status == pb.SERVING_STATUS_SERVING
        finally:
            hog.release()
        out = client.predict("affine", {"x": big})["y"]
        assert out.tobytes() == expected(big).tobytes()
        (model,) = [m for m in client.info().models if m.name == "affine"]
        assert {p.name: p.in_use_bytes for p in model.executor_status.pools} == {
            "pinned": 0,
            "device": 0,
        }
    server = kernel_server.server
    assert server is not None and server.exit_code == 0


def test_a_lane_that_starts_elsewhere_keeps_the_model_off_the_cuda_executor() -> None:
    """The executor is chosen from the model's first session; when a lane's own session
    starts on another provider, the model runs on the CPU executor, which hands every
    session host arrays, rather than feeding that lane device pointers."""
    from dataclasses import replace

    from tensord.backends.base import DeviceOptions
    from tensord.executor.select import build_executor
    from tests.gpu.kernel_backend import KernelBackend, expected

    class OnTheCpu(KernelBackend):
        """A session that started on the CPU provider (it reads host arrays only)."""

        def __init__(self, stream: int) -> None:
            super().__init__(stream)
            self.placement = replace(self.placement, provider="CPUExecutionProvider")

    made: list[KernelBackend] = []

    def make(where: DeviceOptions) -> KernelBackend:
        lane = where.cuda_stream is not None
        backend = KernelBackend(where.cuda_stream) if lane and not made else OnTheCpu(0)
        made.append(backend)
        return backend

    executor, backend = build_executor(
        "affine", KernelBackend(0), make, lambda kind: 2, DeviceOptions()
    )
    try:
        assert executor.kind == "cpu"
        assert executor.reason == (
            "lane 1's session started on CPUExecutionProvider, not on CUDA as the model's "
            "first session did; batches stay in host memory"
        )
        assert backend is made[-1] and len(made) == 3  # two lanes, then the host session
        x = np.random.default_rng(3).normal(size=(3, 17)).astype(np.float32)
        (out,) = run_batches(executor, [[{"x": x}]])
        assert out.tobytes() == expected(x).tobytes()
    finally:
        executor.close()  # and its backend
