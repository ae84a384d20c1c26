"""GPU executor benchmarks: copy bandwidth through the pinned pool, and lane overlap.

    python benchmarks/gpu_bench.py [--mib 64] [--reps 20] [--batches 48]

Needs a CUDA device (cuda-python); nothing here runs without one.

1. Host-to-device bandwidth of `--mib` MiB copies, timed with CUDA events (median of
   `--reps`): from a buffer taken from tensord's PinnedHostPool each time (acquire, copy,
   release), against a raw cudaMemcpyAsync from one cudaHostAlloc buffer (the limit), and
   from pageable NumPy memory for contrast. Target: pool >= 0.8 x raw.
2. Pipeline overlap: tensord's CudaExecutor runs `--batches` batches of `--mib` MiB in and
   out through the device backend of tests/gpu/kernel_backend.py (an NVRTC kernel, no
   onnxruntime-gpu), its spin tuned so that one batch's kernel takes about as long as the
   rest of the lane's work on it (staging, upload, download), first on 1 lane, then on 2.
   With 2 lanes batch k+1's copies overlap batch k's kernel. Target: 2 lanes >= 1.5 x 1.

Results go to benchmarks/results/gpu-<timestamp>.json (or `--out`) and a table is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import use_venv
from cuda.bindings import runtime as cudart

from tensord.cuda.memory import PinnedHostPool
from tensord.cuda.runtime import check
from tensord.devices import probe_gpus
from tensord.executor.cuda.executor import CudaExecutor

sys.path.insert(0, str(use_venv.REPO))
from tests.gpu.kernel_backend import KernelBackend, kernel_function, launch

H2D = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice


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


def tune_iters(kernel: Any, nbytes: int, copy_ms: float) -> tuple[int, float]:
    """Spin iterations that make one batch's kernel take about one lane's copy time."""
    stream = check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "stream")
    device = int(check(cudart.cudaMalloc(nbytes), "cudaMalloc"))
    count = nbytes // 4

    def spin(iters: int) -> float:
        return event_ms(stream, lambda s: launch(kernel, device, device, count, iters, int(s)))

    iters = 64
    while True:
        ms = spin(iters)
        if ms >= copy_ms or iters > 1 << 24:
            break
        iters *= 2
    iters = max(1, int(iters * copy_ms / ms))
    ms = spin(iters)
    cudart.cudaFree(device)
    cudart.cudaStreamDestroy(stream)
    return iters, ms


async def pipeline_rate(lanes: int, nbytes: int, iters: int, batches: int) -> float:
    """Batches per second through a CudaExecutor with `lanes` lanes."""
    executor = CudaExecutor("bench", lambda stream: KernelBackend(stream, spin=iters), lanes)
    x = np.random.default_rng(1).normal(size=nbytes // 4).astype(np.float32).reshape(1, -1)
    # Warm-up with every lane busy at once: each lane's pinned and device buffers are
    # allocated now, never inside the timed window.
    try:
        await asyncio.gather(*(executor.run([{"x": x}], ["y"]) for _ in range(2 * lanes)))
        start = time.perf_counter()
        await asyncio.gather(*(executor.run([{"x": x}], ["y"]) for _ in range(batches)))
        return batches / (time.perf_counter() - start)
    finally:
        executor.close()


def main() -> None:
    """Measure, print, write JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64, help="bytes per copy and batch, MiB")
    parser.add_argument("--reps", type=int, default=20, help="timed copies per case")
    parser.add_argument("--batches", type=int, default=48, help="batches per pipeline run")
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    args = parser.parse_args()
    nbytes = args.mib << 20
    gpus = probe_gpus()
    if not gpus.gpus:
        raise SystemExit(f"gpu_bench: no CUDA device here ({gpus.unavailable_reason})")
    check(cudart.cudaSetDevice(0), "cudaSetDevice")
    props = check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    bandwidth = copy_bandwidth(nbytes, args.reps)
    copy_ms = nbytes / (bandwidth["raw_pinned"] * 1e9) * 1e3
    kernel = kernel_function(0)
    # "Copy time" is what a lane spends on a batch besides the kernel, as the executor
    # does it (staging the request into a pinned buffer, H2D, D2H, events), measured with
    # a one-iteration kernel on one lane; the kernel is tuned to match it.
    stage_ms = 1e3 / asyncio.run(pipeline_rate(1, nbytes, 1, max(8, args.batches // 2)))
    iters, kernel_ms = tune_iters(kernel, nbytes, stage_ms)
    one = asyncio.run(pipeline_rate(1, nbytes, iters, args.batches))
    two = asyncio.run(pipeline_rate(2, nbytes, iters, args.batches))
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
    path = args.out or out_dir / f"gpu-{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
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
    print(f"results: {path}")


if __name__ == "__main__":
    main()
