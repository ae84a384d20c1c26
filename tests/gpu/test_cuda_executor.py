"""The CUDA executor on a real device: pools, copies both ways, ONNX Runtime IOBinding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_pinned_pool_round_trip() -> None:
    from tensord.cuda.memory import PinnedHostPool

    pool = PinnedHostPool()
    buffer = pool.acquire(10_000)
    view = buffer.view(np.dtype(np.float32), (2500,))
    data = np.random.default_rng(0).normal(size=2500).astype(np.float32)
    view[:] = data
    pool.release(buffer)
    again = pool.acquire(9_000)
    assert again.ptr == buffer.ptr
    assert again.view(np.dtype(np.float32), (2500,)).tobytes() == data.tobytes()
    stats = pool.stats()
    assert (stats.allocations, stats.reuses, stats.in_use_bytes) == (1, 1, 16384)
    pool.release(again)
    pool.clear()


def test_copies_in_both_directions() -> None:
    from cuda.bindings import runtime as cudart

    from tensord.cuda.memory import DevicePool, PinnedHostPool
    from tensord.cuda.runtime import check

    pinned, device = PinnedHostPool(), DevicePool()
    stream = check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "stream")
    data = np.random.default_rng(1).integers(0, 2**31, 1 << 20, dtype=np.int64)
    src, dst, dev = (
        pinned.acquire(data.nbytes),
        pinned.acquire(data.nbytes),
        device.acquire(data.nbytes),
    )
    src.view(data.dtype, data.shape)[:] = data
    dst.view(data.dtype, data.shape)[:] = -1  # poisoned: every element must be written
    kinds = cudart.cudaMemcpyKind
    check(
        cudart.cudaMemcpyAsync(dev.ptr, src.ptr, data.nbytes, kinds.cudaMemcpyHostToDevice, stream),
        "h2d",
    )
    check(
        cudart.cudaMemcpyAsync(dst.ptr, dev.ptr, data.nbytes, kinds.cudaMemcpyDeviceToHost, stream),
        "d2h",
    )
    check(cudart.cudaStreamSynchronize(stream), "sync")
    assert dst.view(data.dtype, data.shape).tobytes() == data.tobytes()
    for pool, buffer in ((pinned, src), (pinned, dst), (device, dev)):
        pool.release(buffer)
    pinned.clear()
    device.clear()
    check(cudart.cudaStreamDestroy(stream), "destroy")


@pytest.mark.ort_gpu
async def test_cuda_ep_iobinding_matches_in_process_ort(demo_repo: Path) -> None:
    """Lanes of CUDA-provider sessions bound to device buffers (IOBinding) give what one
    in-process CUDA session with the same options (TF32 off, tensord's default) gives on
    the joined batch, bit for bit, and what the CPU gives to float32 rounding."""
    import onnxruntime as ort

    from tensord.backends.base import DeviceOptions
    from tensord.backends.onnxruntime import OnnxRuntimeBackend
    from tensord.executor.cuda.executor import CudaExecutor
    from tensord.modelconfig.model import ModelConfig

    path = demo_repo / "mlp" / "1" / "model.onnx"
    gpu_config = ModelConfig(preferred_provider="cuda")
    executor = CudaExecutor(
        "mlp",
        lambda stream: OnnxRuntimeBackend(path, gpu_config, DeviceOptions(cuda_stream=stream)),
        2,
    )
    assert executor.primary_backend.placement.provider == "CUDAExecutionProvider"
    cpu = OnnxRuntimeBackend(path, ModelConfig(providers=["cpu"]))
    rng = np.random.default_rng(2)
    parts = [{"input": rng.normal(size=(n, 512)).astype(np.float32)} for n in (1, 7, 32)]
    result = await executor.run(parts, ["output"])
    joined = np.concatenate([p["input"] for p in parts])
    (expected,) = cpu.run({"input": joined}, ["output"])
    np.testing.assert_allclose(result.outputs[0], expected, rtol=1e-4, atol=1e-5)
    in_process = ort.InferenceSession(
        str(path), providers=[("CUDAExecutionProvider", {"use_tf32": "0"})]
    )
    assert in_process.get_providers()[0] == "CUDAExecutionProvider"
    (same,) = in_process.run(["output"], {"input": joined})
    assert result.outputs[0].tobytes() == same.tobytes()
    stats = executor.stats()
    assert stats.kind == "cuda" and stats.pools["pinned"].in_use_bytes == 0
    executor.close()
