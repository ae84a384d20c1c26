"""The compute limit: ONNX Runtime in this process on the daemon's own model and options.

It builds the session the way the daemon does (tensord's OnnxRuntimeBackend with the
model's model.toml, so intra_op_threads, inter_op_threads, spinning and graph
optimisation match) and runs it back-to-back with no RPC around it:
  batch 1 from one thread       runs/s: the compute side of the unbatched limit
  batch 1 from instance_count   runs/s: what the daemon's runner pool could reach
          threads at once                 if transport cost nothing (reference)
  batch 32 from one thread      samples/s: what batching could buy (reference)

Run as a subprocess while nothing else of the benchmark runs; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cpustat import CpuSample, cpu_between
from payloads import INPUT_NAME, MODEL, OUTPUT_NAME, batch
from stats import summarize_ns

from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.modelconfig.model import ModelConfig
from tensord.registry.repository import scan_repository


def find_model(repository: Path, name: str = MODEL) -> tuple[Path, ModelConfig, int]:
    """The newest loadable version of `name`: (model file, its config, version)."""
    sources = [s for s in scan_repository(repository) if s.name == name and not s.error]
    if not sources:
        raise SystemExit(f"ort_limit: no loadable model {name!r} in {repository}")
    newest = max(sources, key=lambda s: s.version)
    return newest.path, newest.config, newest.version


def _loop(backend: OnnxRuntimeBackend, size: int, until: float, out: list[int]) -> None:
    """Back-to-back runs until `until` (monotonic s); appends each run's ns to `out`."""
    feeds = {INPUT_NAME: batch(size)}
    names = [OUTPUT_NAME]
    clock = time.monotonic_ns
    stop = int(until * 1e9)
    while True:
        start = clock()
        if start >= stop:
            return
        backend.run(feeds, names)
        out.append(clock() - start)


def measure(
    backend: OnnxRuntimeBackend, size: int, threads: int, warmup: float, duration: float
) -> dict[str, Any]:
    """Runs/s and samples/s of `threads` callers at batch `size`, after a warm-up."""
    _loop(backend, size, time.monotonic() + warmup, [])
    runs: list[list[int]] = [[] for _ in range(threads)]
    start = time.monotonic()
    until = start + duration
    workers = [
        threading.Thread(target=_loop, args=(backend, size, until, runs[i])) for i in range(threads)
    ]
    watch = [("ort", os.getpid())]
    before = CpuSample.take(watch)
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    cpu = cpu_between(before, CpuSample.take(watch))
    elapsed = time.monotonic() - start
    latencies = [ns for per_thread in runs for ns in per_thread]
    count = len(latencies)
    return {
        "batch": size,
        "threads": threads,
        "runs": count,
        "runs_per_s": count / elapsed,
        "samples_per_s": count * size / elapsed,
        "cpu_s_per_run": cpu["ort"] / count if count else None,
        "window_s": elapsed,
        "cpu_s": cpu,
        "latency_us": summarize_ns(latencies),
    }


def main() -> int:
    """Measure and print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument(
        "--big-batches",
        default="32",
        help="comma-separated batch sizes measured on one thread; the best counts",
    )
    args = parser.parse_args()
    path, config, version = find_model(args.model_repository)
    backend = OnnxRuntimeBackend(path, config)
    instances = config.instance_count
    single = measure(backend, 1, 1, args.warmup, args.duration)
    parallel = None
    if instances > 1:
        parallel = measure(backend, 1, instances, args.warmup / 2, args.duration)
    bigs = [
        measure(backend, int(size), 1, args.warmup / 2, args.duration)
        for size in args.big_batches.split(",")
    ]
    big = max(bigs, key=lambda m: float(m["samples_per_s"]))
    report = {
        "model_file": str(path),
        "version": version,
        "provider": backend.placement.provider,
        "session": {
            "intra_op_threads": config.intra_op_threads,
            "inter_op_threads": config.inter_op_threads,
            "allow_spinning": config.allow_spinning,
            "instance_count": instances,
        },
        "batch1": single,
        "batch1_parallel": parallel,
        "big_batch": big,
        "big_batches": bigs,
    }
    backend.close()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
