"""A device backend made of one NVRTC kernel: the CUDA executor on a GPU without
onnxruntime-gpu.

`y = 2 x + 1` over a float32 tensor, on the lane's stream, after `spin` rounds of busy
arithmetic per element (the compute whose length a test or benchmark chooses). Outputs
come from the backend's own DevicePool and go back to it once the executor has copied
them out (`release`), as the native TensorRT backend's do. With `record=True` each run
records CUDA events around its kernel, so a test can see on the device's own clock
whether one lane's copies overlapped another lane's compute.

Used by tests/gpu/test_kernel_executor.py and benchmarks/gpu_bench.py.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from cuda.bindings import driver
from cuda.bindings import runtime as cudart

from tensord.backends.base import BackendPlacement, DeviceTensor, PooledOutput, TensorSpec
from tensord.cuda.memory import DevicePool
from tensord.cuda.runtime import check
from tensord.dtypes import DType
from tensord.kernels.compiler import arch_for, compile_source
from tensord.kernels.driver import drv_check, i32, i64, pointer

SOURCE = rb"""
extern "C" __global__ void affine_spin(const float* x, float* y, long long n, int spin,
                                       float* sink) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    float s = v;
    for (int k = 0; k < spin; ++k) s = s * 1.0000001f + 0.5f;
    y[i] = v * 2.0f + 1.0f;
    if (sink != nullptr) sink[i] = s;  /* keeps the loop: its result may be read */
}
"""
THREADS = 256
FLOAT = 1  # ONNX TensorProto FLOAT


def expected(x: np.ndarray) -> np.ndarray:
    """What the kernel computes, bit for bit (2x is exact, so one rounding either way)."""
    return x * np.float32(2) + np.float32(1)


@cache
def kernel_function(device_id: int) -> Any:
    """The kernel as a CUBIN for the device, loaded into its primary context once."""
    check(cudart.cudaSetDevice(device_id), "cudaSetDevice")
    check(cudart.cudaFree(0), "cudaFree(0) (create the primary context)")
    props = check(cudart.cudaGetDeviceProperties(device_id), "cudaGetDeviceProperties")
    cubin = compile_source(SOURCE, "affine_spin.cu", arch_for(int(props.major), int(props.minor)))
    module = drv_check(driver.cuModuleLoadData(cubin.cubin), "cuModuleLoadData")
    return drv_check(driver.cuModuleGetFunction(module, b"affine_spin"), "cuModuleGetFunction")


def launch(function: Any, x: int, y: int, count: int, spin: int, stream: int) -> None:
    """affine_spin over `count` floats on `stream`."""
    if count == 0:
        return
    blocks = (count + THREADS - 1) // THREADS
    args = (pointer(x), pointer(y), i64(count), i32(spin), pointer(0))
    drv_check(
        driver.cuLaunchKernel(
            function,
            blocks, 1, 1, THREADS, 1, 1, 0,
            driver.CUstream(int(stream)),
            (tuple(a[0] for a in args), tuple(a[1] for a in args)),
            0,
        ),
        "cuLaunchKernel affine_spin",
    )  # fmt: skip


@dataclass(slots=True)
class KernelSpan:
    """Two timing events on a lane's stream: inputs on the device (the lane's H2D copies
    are done) and the kernel finished."""

    stream: int
    ready: Any
    done: Any


class KernelBackend:
    """One lane's session: the kernel on that lane's stream (`stream`, a cudaStream_t
    address), input `x` and output `y`, float32, any shape."""

    def __init__(
        self, stream: int, spin: int = 0, device_id: int = 0, record: bool = False
    ) -> None:
        self.stream, self.spin, self.record = stream, spin, record
        self.function = kernel_function(device_id)
        self.pool = DevicePool()
        self.spans: list[KernelSpan] = []
        self._lock = threading.Lock()
        self.inputs = [TensorSpec("x", DType.FLOAT32, (-1, -1))]
        self.outputs = [TensorSpec("y", DType.FLOAT32, (-1, -1))]
        self.placement = BackendPlacement(
            "nvrtc-kernel", "CUDA", "an NVRTC kernel on the lane's stream", ("CUDA",)
        )

    def _event(self) -> Any:
        event = check(cudart.cudaEventCreate(), "cudaEventCreate")
        check(cudart.cudaEventRecord(event, self.stream), "cudaEventRecord")
        return event

    def run_device(
        self, inputs: Mapping[str, DeviceTensor], output_names: Sequence[str]
    ) -> list[PooledOutput]:
        """The kernel on the lane's stream; the output stays on the device."""
        x = inputs["x"]
        if x.onnx_type != FLOAT:
            raise TypeError(f"x must be float32, got ONNX type {x.onnx_type}")
        count = int(np.prod(x.shape, dtype=np.int64))
        buffer = self.pool.acquire(count * 4)
        ready = None
        try:
            ready = self._event() if self.record else None
            launch(self.function, x.ptr, buffer.ptr, count, self.spin, self.stream)
            if ready is not None:
                with self._lock:
                    self.spans.append(KernelSpan(self.stream, ready, self._event()))
        except BaseException:
            if ready is not None:
                cudart.cudaEventDestroy(ready)
            # The stream may still use the buffer: the executor syncs before releasing.
            check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
            self.pool.release(buffer)
            raise
        return [PooledOutput(buffer, x.shape, DType.FLOAT32, self.pool)]

    def run(self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[Any]:
        """Host arrays in and out, for callers without the executor (the warm-up)."""
        x = np.ascontiguousarray(inputs["x"], dtype=np.float32)
        return [expected(x)][: len(output_names)]

    def terminate_runs(self) -> None:
        """A kernel launch cannot be cut short: runs finish."""

    def clear_spans(self) -> None:
        """Forget the recorded spans (and destroy their events)."""
        with self._lock:
            spans, self.spans = self.spans, []
        for span in spans:
            cudart.cudaEventDestroy(span.ready)
            cudart.cudaEventDestroy(span.done)

    def close(self) -> None:
        self.clear_spans()
        self.pool.clear()


def elapsed_ms(start: Any, end: Any) -> float:
    """Milliseconds from event `start` to event `end` (both complete; may be negative)."""
    return float(check(cudart.cudaEventElapsedTime(start, end), "cudaEventElapsedTime"))
