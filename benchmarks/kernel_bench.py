"""Kernel benchmarks: each kernel's bandwidth against a device-to-device copy, and image
Predict with GPU preprocessing against CPU preprocessing.

    python benchmarks/kernel_bench.py [--reps 30] [--requests 200] [--batch 8] [--image 480x640]

1. Every kernel runs on a realistic size, timed with CUDA events (median of `--reps`).
   Its bandwidth is the bytes it must move (inputs read once plus outputs written) over
   its time, as a fraction of a cudaMemcpyAsync device-to-device copy (read + write)
   measured in the same run. Target: >= 0.7 for the memory-bound kernels (image
   preprocessing, letterbox, softmax + top-k, KV gather and scatter); NMS is bound by its
   sequential suppression and is reported without a target.
   Each timed repetition starts from a cold L2 (a memset of twice its size runs first,
   outside the events) and behind a gate: a kernel that sleeps on the device while Python
   queues the start event, the launches and the end event, so the host's launch overhead
   (tens of microseconds per cuLaunchKernel from Python) never stands in the window.
2. A daemon (subprocess) serves the demo classifier twice over one ONNX file, both on the
   CUDA provider: `classifier` with [preprocess] and [postprocess] (the kernels run on the
   lane's stream), and `classifier_raw` without them, fed by the NumPy twins in the client
   (CPU preprocessing and top-k). `--requests` sequential requests of `--batch` uint8
   images each; images/s and p50/p99 latency per path.

Without a CUDA device it says so and exits 0 without measuring anything. Results go to
benchmarks/results/kernels-<timestamp>.json (or `--out`) and a table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import use_venv

from tensord.devices import probe_gpus

MEMORY_BOUND = {"resize_normalize", "letterbox", "softmax_topk", "kv_gather", "kv_scatter"}
CLASSIFIER_MEAN = (123.675, 116.28, 103.53)
CLASSIFIER_STD = (58.395, 57.12, 57.375)


GATE_SOURCE = rb"""
extern "C" __global__ void gate(long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < (unsigned long long)ns);
}
"""


def gate_kernel() -> Any:
    """The gate kernel, compiled with NVRTC for device 0 and loaded into its context."""
    from cuda.bindings import driver
    from cuda.bindings import runtime as cudart

    from tensord.cuda.runtime import check
    from tensord.kernels.compiler import arch_for, compile_source
    from tensord.kernels.driver import drv_check

    props = check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    cubin = compile_source(GATE_SOURCE, "gate.cu", arch_for(int(props.major), int(props.minor)))
    module = drv_check(driver.cuModuleLoadData(cubin.cubin), "cuModuleLoadData")
    return drv_check(driver.cuModuleGetFunction(module, b"gate"), "cuModuleGetFunction")


class Bench:
    """Device buffers, a stream and event timing."""

    def __init__(self, cache: Path) -> None:
        from cuda.bindings import runtime as cudart

        from tensord.cuda.runtime import check
        from tensord.kernels.driver import load_kernels
        from tensord.kernels.sources import FAMILIES

        self.rt, self.check = cudart, check
        check(cudart.cudaSetDevice(0), "cudaSetDevice")
        self.stream = int(
            check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "s")
        )
        self.kernels = load_kernels(0, cache, FAMILIES)
        self.ptrs: list[int] = []
        self.l2_bytes = int(
            check(
                cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr.cudaDevAttrL2CacheSize, 0),
                "cudaDeviceGetAttribute L2",
            )
        )
        self.flush = self.empty((max(2 * self.l2_bytes, 64 << 20),), np.uint8)
        self.gate_function = gate_kernel()
        self.gate_ms = 0.0
        self.gate_misses = 0
        """Repetitions whose launches took longer to queue than the gate held the stream."""

    def upload(self, array: np.ndarray) -> Any:
        from tensord.kernels.gpu import DeviceArray

        array = np.ascontiguousarray(array)
        ptr = int(self.check(self.rt.cudaMalloc(max(array.nbytes, 1)), "cudaMalloc"))
        self.ptrs.append(ptr)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.check(self.rt.cudaMemcpy(ptr, array.ctypes.data, array.nbytes, kind), "cudaMemcpy")
        return DeviceArray(ptr, array.shape, array.dtype)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        from tensord.kernels.gpu import DeviceArray

        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dt.itemsize
        ptr = int(self.check(self.rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        self.ptrs.append(ptr)
        return DeviceArray(ptr, tuple(shape), dt)

    def median_ms(self, work: Callable[[], None], reps: int) -> float:
        """Median device time of `work` (launches on self.stream), after one warm-up: each
        repetition from a cold L2 and with the launches queued behind the gate."""
        rt, check = self.rt, self.check
        start = check(rt.cudaEventCreate(), "cudaEventCreate")
        end = check(rt.cudaEventCreate(), "cudaEventCreate")
        check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        work()  # the first launch may load lazily: not the one the gate is sized from
        check(rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        t0 = time.perf_counter()
        work()
        enqueue_s = time.perf_counter() - t0
        check(rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        # The gate must outlast queuing the whole window: 4x a warm enqueue covers its
        # jitter; 50 ms at most (a repetition's cost stays bounded).
        gate_ns = min(50_000_000, max(200_000, int(4 * enqueue_s * 1e9)))
        times = []
        for rep in range(reps):
            self.flush_l2(rep)
            self.gate(gate_ns)
            t0 = time.perf_counter()
            check(rt.cudaEventRecord(start, self.stream), "cudaEventRecord")
            work()
            check(rt.cudaEventRecord(end, self.stream), "cudaEventRecord")
            queued_ns = (time.perf_counter() - t0) * 1e9
            check(rt.cudaEventSynchronize(end), "cudaEventSynchronize")
            if queued_ns > gate_ns:  # the gate opened early: launch gaps were timed
                self.gate_misses += 1
            times.append(float(check(rt.cudaEventElapsedTime(start, end), "cudaEventElapsedTime")))
        rt.cudaEventDestroy(start)
        rt.cudaEventDestroy(end)
        self.gate_ms = max(self.gate_ms, gate_ns / 1e6)
        return statistics.median(times)

    def flush_l2(self, rep: int) -> None:
        """Overwrite twice L2's size, so the next kernel reads its inputs from memory."""
        self.check(
            self.rt.cudaMemsetAsync(self.flush.ptr, rep & 0xFF, self.flush.nbytes, self.stream),
            "cudaMemsetAsync (L2 flush)",
        )

    def gate(self, ns: int) -> None:
        """Hold the stream for `ns` nanoseconds of device time."""
        from cuda.bindings import driver

        from tensord.kernels.driver import drv_check, i64

        value, ctype = i64(ns)
        drv_check(
            driver.cuLaunchKernel(
                self.gate_function, 1, 1, 1, 1, 1, 1, 0, driver.CUstream(self.stream),
                ((value,), (ctype,)), 0,
            ),
            "cuLaunchKernel gate",
        )  # fmt: skip

    def copy_gb_per_s(self, nbytes: int, reps: int) -> float:
        """Device-to-device cudaMemcpyAsync: (read + write) bytes per second, in GB/s."""
        src, dst = self.empty((nbytes,), np.uint8), self.empty((nbytes,), np.uint8)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice

        def copy() -> None:
            self.check(self.rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, kind, self.stream), "copy")

        return 2 * nbytes / (self.median_ms(copy, reps) / 1e3) / 1e9

    def close(self) -> None:
        for ptr in self.ptrs:
            self.rt.cudaFree(ptr)
        self.rt.cudaStreamDestroy(self.stream)


def kernel_cases(
    b: Bench, rng: np.random.Generator
) -> dict[str, tuple[Callable[[], None], int, str]]:
    """name -> (launch, bytes moved, what), on realistic sizes."""
    from tensord.kernels import gpu
    from tensord.kernels.image import Normalisation, letterbox_geometry
    from tensord.kernels.nms import NmsSettings

    k, s = b.kernels, b.stream
    norm = Normalisation.from_mean_std(CLASSIFIER_MEAN, CLASSIFIER_STD)
    cases: dict[str, tuple[Callable[[], None], int, str]] = {}

    imgs = b.upload(rng.integers(0, 256, (64, 256, 256, 3), dtype=np.uint8))
    out = b.empty((64, 3, 224, 224), np.float32)
    cases["resize_normalize"] = (
        lambda: gpu.resize_normalize(k, s, imgs, out, norm), imgs.nbytes + out.nbytes,
        "64 x 256x256 uint8 -> 224x224 float32 NCHW",
    )  # fmt: skip
    hd = b.upload(rng.integers(0, 256, (16, 720, 1280, 3), dtype=np.uint8))
    lb = b.empty((16, 3, 640, 640), np.float16)
    geo = letterbox_geometry(720, 1280, 640, 640)
    cases["letterbox"] = (
        lambda: gpu.letterbox(k, s, hd, lb, norm, geo, 114.0), hd.nbytes + lb.nbytes,
        "16 x 720x1280 uint8 -> 640x640 float16 NCHW",
    )  # fmt: skip
    logits = b.upload(rng.normal(0, 3, (16384, 1000)).astype(np.float32))
    idx, val = b.empty((16384, 5), np.int32), b.empty((16384, 5), np.float32)
    cases["softmax_topk"] = (
        lambda: gpu.softmax_topk(k, s, logits, 5, True, idx, val),
        logits.nbytes + idx.nbytes + val.nbytes, "16384 x 1000 float32, k = 5",
    )  # fmt: skip
    xy = rng.uniform(0, 600, (16, 8400, 2)).astype(np.float32)
    boxes = b.upload(np.concatenate([xy, xy + rng.uniform(4, 120, xy.shape).astype(np.float32)], 2))
    scores = b.upload(rng.uniform(0, 0.5, (16, 8400, 80)).astype(np.float32) ** 2)
    settings = NmsSettings(0.2, 0.5, 300, 1024)
    nms_out = [b.empty((16, 300, 4), np.float32), b.empty((16, 300), np.float32),
               b.empty((16, 300), np.int32), b.empty((16,), np.int32)]  # fmt: skip
    cases["nms"] = (
        lambda: gpu.nms(k, s, boxes, scores, settings, *nms_out), boxes.nbytes + scores.nbytes,
        "16 x 8400 boxes x 80 classes (YOLO-sized), score > 0.2",
    )  # fmt: skip
    nb, h, bs, d, batch, per_seq = 4096, 8, 16, 128, 64, 1024
    pool = b.upload(rng.normal(size=(nb, h, bs, d)).astype(np.float16))
    tables = b.upload(rng.permutation(nb).astype(np.int32).reshape(batch, per_seq // bs))
    lens = b.upload(np.full(batch, per_seq, np.int32))
    past = b.empty((batch, h, per_seq, d), np.float16)
    cases["kv_gather"] = (
        lambda: gpu.kv_gather(k, s, pool, tables, lens, past), 2 * past.nbytes,
        f"{batch} sequences x {per_seq} tokens, 8 heads x 128 float16",
    )  # fmt: skip
    new = b.upload(rng.normal(size=(batch, h, 512, d)).astype(np.float16))
    start = b.upload(np.zeros(batch, np.int32))
    count = b.upload(np.full(batch, 512, np.int32))
    cases["kv_scatter"] = (
        lambda: gpu.kv_scatter(k, s, new, tables, start, count, pool), 2 * new.nbytes,
        f"{batch} sequences x 512 new tokens, 8 heads x 128 float16",
    )  # fmt: skip
    return cases


def measure_kernels(reps: int, cache: Path) -> dict[str, Any]:
    """Each kernel's GB/s and its ratio to the device-to-device copy."""
    bench = Bench(cache)
    try:
        rng = np.random.default_rng(0)
        copy = bench.copy_gb_per_s(256 << 20, reps)
        results: dict[str, Any] = {"copy_gb_per_s": copy, "kernels": {}}
        results["timing"] = {
            "l2_bytes": bench.l2_bytes,
            "l2_flush_bytes": bench.flush.nbytes,
            "launch_overhead": "held out: launches queued behind a gate kernel",
        }
        for name, (launch, nbytes, what) in kernel_cases(bench, rng).items():
            ms = bench.median_ms(launch, reps)
            gbs = nbytes / (ms / 1e3) / 1e9
            results["kernels"][name] = {
                "what": what, "ms": ms, "bytes": nbytes, "gb_per_s": gbs,
                "of_copy": gbs / copy, "target": 0.7 if name in MEMORY_BOUND else None,
            }  # fmt: skip
        results["timing"].update(gate_ms=bench.gate_ms, gate_misses=bench.gate_misses)
        return results
    finally:
        bench.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(repo: Path, cache: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`tensord serve` over `repo`; returns once it reports SERVING."""
    from tensord.v1 import inference_pb2 as pb
    from tensord_client import Client

    target = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensord.cli", "serve", "--listen", target,
         "--model-repository", str(repo), "--log-level", "warning"],
        env={**os.environ, "TENSORD_CACHE_DIRECTORY": str(cache)},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with Client(target, timeout=2, retries=0) as client:
                if client.health().status == pb.SERVING_STATUS_SERVING:
                    return proc, target
        except Exception:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("kernel_bench: the daemon did not become SERVING within 120 s")


def measure_predict(args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    """Images/s and latency: GPU preprocessing in the daemon against CPU preprocessing."""
    from tensord.demo.repository import build_demo_repository
    from tensord.kernels import Normalisation, resize_normalize, softmax_topk
    from tensord_client import Client

    h, w = (int(v) for v in args.image.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        build_demo_repository(repo)
        for other in ("mlp", "cnn"):
            shutil.rmtree(repo / other)
        raw = repo / "classifier_raw"
        shutil.copytree(repo / "classifier" / "1", raw / "1")
        (raw / "model.toml").write_text("max_batch_size = 64\n")
        proc, target = serve(repo, cache)
        try:
            images = np.random.default_rng(1).integers(
                0, 256, (args.batch, h, w, 3), dtype=np.uint8
            )
            norm = Normalisation.from_mean_std(CLASSIFIER_MEAN, CLASSIFIER_STD)
            with Client(target, timeout=60) as client:
                models = {m.name: m for m in client.info().models}
                devices = {
                    n: (models[n].executor, models[n].preprocess.device or "none")
                    for n in ("classifier", "classifier_raw")
                }

                def gpu_path() -> None:
                    client.predict("classifier", {"image": images})

                def cpu_path() -> None:
                    pixels = resize_normalize(images, 32, 32, norm)
                    logits = client.predict("classifier_raw", {"pixels": pixels})["logits"]
                    softmax_topk(logits, 3)

                if devices["classifier"] != ("cuda", "cuda"):
                    raise SystemExit(
                        "kernel_bench: the daemon did not put the classifier on the CUDA "
                        f"executor with device preprocessing: {devices['classifier']} "
                        f"({models['classifier'].executor_status.reason})"
                    )
                result = {"devices": devices, "batch": args.batch, "image": [h, w]}
                for name, path in (
                    ("gpu_preprocessing", gpu_path),
                    ("cpu_preprocessing", cpu_path),
                ):
                    for _ in range(10):
                        path()
                    times = []
                    for _ in range(args.requests):
                        t0 = time.perf_counter()
                        path()
                        times.append(time.perf_counter() - t0)
                    result[name] = {
                        "images_per_s": args.batch * len(times) / sum(times),
                        "p50_ms": float(np.percentile(times, 50) * 1e3),
                        "p99_ms": float(np.percentile(times, 99) * 1e3),
                    }
                return result
        finally:
            proc.terminate()
            proc.wait(30)


def print_kernels(results: dict[str, Any]) -> None:
    print(f"GPU: {results['gpu']}; device-to-device copy {results['copy_gb_per_s']:.0f} GB/s")
    timing = results["timing"]
    print(
        f"  each repetition: L2 ({timing['l2_bytes'] >> 20} MiB) flushed, launches behind a "
        f"{timing['gate_ms']:.2f} ms gate; gate opened early {timing['gate_misses']} times"
    )
    print(f"  {'kernel':<18} {'ms':>8} {'GB/s':>8} {'of copy':>8}  target  case")
    for name, r in results["kernels"].items():
        target = f">= {r['target']:.1f}" if r["target"] else "   -  "
        figures = f"{r['ms']:8.3f} {r['gb_per_s']:8.0f} {r['of_copy']:8.2f}"
        print(f"  {name:<18} {figures}  {target}  {r['what']}")


def main() -> None:
    """Measure, print, write JSON; without a GPU, say so and exit 0."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=30, help="timed launches per kernel")
    parser.add_argument("--requests", type=int, default=200, help="Predicts per path")
    parser.add_argument("--batch", type=int, default=8, help="images per Predict")
    parser.add_argument("--image", default="480x640", help="image size HxW")
    parser.add_argument("--skip-predict", action="store_true", help="kernels only")
    parser.add_argument("--predict-only", action="store_true", help="the Predict comparison only")
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    args = parser.parse_args()
    gpus = probe_gpus()
    if not gpus.gpus:
        print(f"kernel_bench: no CUDA device here ({gpus.unavailable_reason}); nothing measured")
        return
    cache = use_venv.REPO / "build" / "kernel-bench-cache"
    results: dict[str, Any] = {"gpu": gpus.gpus[0].name, "driver": gpus.driver_version}
    if not args.predict_only:
        results.update(measure_kernels(args.reps, cache))
        print_kernels(results)
    if not args.skip_predict:
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            predict = measure_predict(args, cache)
            results["predict"] = predict
            print(f"Predict, {args.batch} x {args.image} uint8 images to the demo classifier:")
            for name in ("gpu_preprocessing", "cpu_preprocessing"):
                p = predict[name]
                latency = f"p50 {p['p50_ms']:.2f} ms  p99 {p['p99_ms']:.2f} ms"
                print(f"  {name:<18} {p['images_per_s']:8.0f} images/s  {latency}")
            print(f"  (executor, preprocessing) per model: {predict['devices']}")
        else:
            print(
                "Predict: skipped, this ONNX Runtime has no CUDAExecutionProvider (make setup-gpu)"
            )
    out_dir = use_venv.REPO / "benchmarks" / "results"
    path = args.out or out_dir / f"kernels-{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
