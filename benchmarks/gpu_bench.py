"""GPU executor benchmarks: copy bandwidth through the pinned pool, and lane overlap.

    python benchmarks/gpu_bench.py [--mib 64] [--reps 20] [--batches 48]

Needs a CUDA device (cuda-python); nothing here runs without one.

1. Host-to-device bandwidth of `--mib` MiB copies, timed with CUDA events (median of
   `--reps`): from a buffer taken from tensord's PinnedHostPool each time (acquire, copy,
   release), against a raw cudaMemcpyAsync from one cudaHostAlloc buffer (the limit), and
   from pageable NumPy memory for contrast. Target: pool >= 0.8 x raw.
2. Pipeline overlap: tensord's CudaExecutor runs `--batches` batches of `--mib` MiB with a
   compute stand-in, a spin kernel compiled with NVRTC and tuned so that one batch's kernel
   takes about as long as its host-to-device copy, first on 1 lane, then on 2. With 2 lanes
   batch k+1's copy overlaps batch k's kernel. Target: 2 lanes >= 1.5 x 1 lane.

Results go to benchmarks/results/gpu-<timestamp>.json and a table is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import use_venv
from cuda.bindings import driver
from cuda.bindings import runtime as cudart

from tensord.backends.base import DeviceTensor
from tensord.devices import probe_gpus
from tensord.executor.cuda.executor import CudaExecutor
from tensord.executor.cuda.pools import PinnedHostPool
from tensord.executor.cuda.runtime import check
from tensord.kernels.compiler import arch_for, compile_source

H2D = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
SPIN = rb"""
extern "C" __global__ void spin(float* x, long long n, int iters) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < iters; ++k) v = v * 1.0000001f + 0.5f;
        x[i] = v;
    }
}
"""


def drv_check(result: Any, call: str) -> Any:
    """The values of a driver API call, or RuntimeError naming it."""
    values = result if isinstance(result, tuple) else (result,)
    if values[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed: {values[0]}")
    return values[1] if len(values) == 2 else values[1:]


def compile_spin(device: int) -> Any:
    """The spin kernel, as a CUBIN for this device's compute capability (no PTX for the
    driver to JIT: a driver older than NVRTC refuses newer PTX)."""
    props = check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    arch = arch_for(int(props.major), int(props.minor))
    cubin = compile_source(SPIN, "spin.cu", arch, options=()).cubin
    module = drv_check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
    return drv_check(driver.cuModuleGetFunction(module, b"spin"), "cuModuleGetFunction")


def launch_spin(kernel: Any, ptr: int, count: int, iters: int, stream: Any) -> None:
    """Run the spin kernel over `count` floats at `ptr` on `stream`."""
    threads = 256
    blocks = (count + threads - 1) // threads
    args = ((ptr, count, iters), (ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int))
    drv_check(
        driver.cuLaunchKernel(
            kernel, blocks, 1, 1, threads, 1, 1, 0, driver.CUstream(int(stream)), args, 0
        ),
        "cuLaunchKernel",
    )


def event_ms(stream: Any, work: Any) -> float:
    """Milliseconds `work(stream)` takes on the device, between two events."""
    start = check(cudart.cudaEventCreate(), "cudaEventCreate")
    end = check(cudart.cudaEventCreate(), "cudaEventCreate")
    check(cudart.cudaEventRecord(start, stream), "cudaEventRecord")
    work(stream)
    check(cudart.cudaEventRecord(end, stream), "cudaEventRecord")
    check(cudart.cudaEventSynchronize(end), "cudaEventSynchronize")
    ms = float(check(cudart.cudaEventElapsedTime(start, end), "cudaEventElapsedTime"))
    cudart.cudaEventDestroy(start)
    cudart.cudaEventDestroy(end)
    return ms


def copy_bandwidth(nbytes: int, reps: int) -> dict[str, float]:
    """Median H2D GB/s: through the pool, from one raw pinned buffer, from pageable memory."""
    stream = check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "stream")
    device = check(cudart.cudaMalloc(nbytes), "cudaMalloc")
    raw = check(cudart.cudaHostAlloc(nbytes, cudart.cudaHostAllocPortable), "cudaHostAlloc")
    pageable = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    ctypes.memmove(int(raw), pageable.ctypes.data, nbytes)
    pool = PinnedHostPool()

    def through_pool(s: Any) -> None:
        buffer = pool.acquire(nbytes)
        check(cudart.cudaMemcpyAsync(device, buffer.ptr, nbytes, H2D, s), "cudaMemcpyAsync")
        check(cudart.cudaStreamSynchronize(s), "sync")  # the buffer goes back once copied
        pool.release(buffer)

    cases = {
        "raw_pinned": lambda s: check(cudart.cudaMemcpyAsync(device, raw, nbytes, H2D, s), "copy"),
        "pool_pinned": through_pool,
        "pageable": lambda s: check(
            cudart.cudaMemcpyAsync(device, pageable.ctypes.data, nbytes, H2D, s), "copy"
        ),
    }
    result = {}
    for name, work in cases.items():
        event_ms(stream, work)  # warm-up
        times = [event_ms(stream, work) for _ in range(reps)]
        result[name] = nbytes / (statistics.median(times) / 1e3) / 1e9
    pool.clear()
    cudart.cudaFreeHost(raw)
    cudart.cudaFree(device)
    cudart.cudaStreamDestroy(stream)
    return result


class Output:
    """The first KiB of the batch's device buffer, as the executor's D2H copy expects."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr

    def shape(self) -> tuple[int, ...]:
        return (256,)

    def data_type(self) -> str:
        return "tensor(float)"


class SpinBackend:
    """A device backend whose compute is the spin kernel on the lane's stream."""

    def __init__(self, kernel: Any, stream: int, iters: int) -> None:
        self.kernel, self.stream, self.iters = kernel, stream, iters

    def run_device(self, inputs: Mapping[str, DeviceTensor], names: Sequence[str]) -> list[Output]:
        tensor = inputs["x"]
        count = int(np.prod(tensor.shape))
        launch_spin(self.kernel, tensor.ptr, count, self.iters, self.stream)
        return [Output(tensor.ptr)]

    def close(self) -> None:
        pass


def tune_iters(kernel: Any, nbytes: int, copy_ms: float) -> tuple[int, float]:
    """Spin iterations that make one batch's kernel take about one H2D copy's time."""
    stream = check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "stream")
    device = check(cudart.cudaMalloc(nbytes), "cudaMalloc")
    count = nbytes // 4
    iters = 64
    while True:
        ms = event_ms(stream, lambda s, i=iters: launch_spin(kernel, int(device), count, i, s))
        if ms >= copy_ms or iters > 1 << 20:
            break
        iters *= 2
    iters = max(1, int(iters * copy_ms / ms))
    ms = event_ms(stream, lambda s: launch_spin(kernel, int(device), count, iters, s))
    cudart.cudaFree(device)
    cudart.cudaStreamDestroy(stream)
    return iters, ms


async def pipeline_rate(kernel: Any, lanes: int, nbytes: int, iters: int, batches: int) -> float:
    """Batches per second through a CudaExecutor with `lanes` lanes."""
    executor = CudaExecutor("bench", lambda stream: SpinBackend(kernel, stream, iters), lanes)
    x = np.random.default_rng(1).normal(size=nbytes // 4).astype(np.float32).reshape(1, -1)
    # Warm-up with every lane busy at once: each lane's pinned and device buffers are
    # allocated now, never inside the timed window.
    await asyncio.gather(*(executor.run([{"x": x}], ["y"]) for _ in range(2 * lanes)))
    start = time.perf_counter()
    await asyncio.gather(*(executor.run([{"x": x}], ["y"]) for _ in range(batches)))
    rate = batches / (time.perf_counter() - start)
    executor.close()
    return rate


def main() -> None:
    """Measure, print, write JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64, help="bytes per copy and batch, MiB")
    parser.add_argument("--reps", type=int, default=20, help="timed copies per case")
    parser.add_argument("--batches", type=int, default=48, help="batches per pipeline run")
    args = parser.parse_args()
    nbytes = args.mib << 20
    gpus = probe_gpus()
    if not gpus.gpus:
        raise SystemExit(f"gpu_bench: no CUDA device here ({gpus.unavailable_reason})")
    check(cudart.cudaSetDevice(0), "cudaSetDevice")
    props = check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    bandwidth = copy_bandwidth(nbytes, args.reps)
    copy_ms = nbytes / (bandwidth["raw_pinned"] * 1e9) * 1e3
    kernel = compile_spin(0)
    # "Copy time" is what a lane spends on a batch besides the kernel, as the executor
    # does it (staging the request into a pinned buffer, H2D, D2H, events), measured with
    # a one-iteration kernel on one lane; the kernel is tuned to match it.
    stage_ms = 1e3 / asyncio.run(pipeline_rate(kernel, 1, nbytes, 1, max(8, args.batches // 2)))
    iters, kernel_ms = tune_iters(kernel, nbytes, stage_ms)
    one = asyncio.run(pipeline_rate(kernel, 1, nbytes, iters, args.batches))
    two = asyncio.run(pipeline_rate(kernel, 2, nbytes, iters, args.batches))
    results = {
        "gpu": props.name.split(b"\0", 1)[0].decode(),
        "mib": args.mib,
        "h2d_gb_per_s": bandwidth,
        "pool_over_raw": bandwidth["pool_pinned"] / bandwidth["raw_pinned"],
        "copy_ms": copy_ms,
        "stage_ms": stage_ms,
        "kernel_ms": kernel_ms,
        "spin_iters": iters,
        "batches_per_s": {"1_lane": one, "2_lanes": two},
        "two_over_one": two / one,
    }
    out_dir = use_venv.REPO / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"gpu-{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"GPU: {results['gpu']}, {args.mib} MiB per copy/batch")
    for name, value in bandwidth.items():
        print(f"  H2D {name:<12} {value:7.1f} GB/s")
    print(f"  pool / raw pinned: {results['pool_over_raw']:.2f} (target >= 0.80)")
    print(
        f"  raw copy {copy_ms:.2f} ms; a lane's copy stage {stage_ms:.2f} ms; kernel "
        f"{kernel_ms:.2f} ms ({iters} spin iterations)"
    )
    print(f"  1 lane {one:.1f} batches/s, 2 lanes {two:.1f} batches/s: {two / one:.2f}x")
    print("  (target: 2 lanes >= 1.5x 1 lane)")
    print(f"results: {Path(path).relative_to(use_venv.REPO)}")


if __name__ == "__main__":
    main()
