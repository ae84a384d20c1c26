"""One measurement point: one server, one concurrency, the load generator, CPU accounting.

The load generator runs in `client_procs` subprocesses that split the concurrency (and
the connections); they connect and check the server first, then all start on one GO time,
warm up, and measure over the same window. Meanwhile this (sleeping) process samples the
CPU time of the server (and of each of its parts: a supervised daemon's engine and
frontends), the clients and the machine at the window's edges.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Protocol

from cpustat import CpuSample, cpu_between
from payloads import INPUT_FEATURES, MODEL
from procs import ProcessGroup, python_script, read_line
from servers import Server
from stats import summarize_ns

_READY_TIMEOUT_S = 150.0  # the daemon may still be loading models on the first point
_GO_DELAY_NS = 100_000_000


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """How to load a server: calls in flight, driver, processes, timings."""

    concurrency: int
    client: str  # "aio" or "sync"
    client_procs: int
    warmup_s: float
    duration_s: float
    timeout_s: float
    connections: int = 1
    """Channels (TCP connections) in all, split over the processes like the calls."""
    model: str = MODEL
    features: int = INPUT_FEATURES
    """The request: model name and float32 values of its batch-1 input."""
    cpus: tuple[int, ...] | None = None
    """Cores the load generators may run on (None: any)."""


class WindowObserver(Protocol):
    """Something to do while the window is open (profiling); both calls must return fast."""

    def window_started(self, server: Server, duration_s: float) -> None:
        """Called at the window's start, after the first CPU sample."""

    def window_ended(self) -> None:
        """Called at the window's end, after the last CPU sample."""


def split(total: int, parts: int) -> list[int]:
    """`total` calls in flight spread over at most `parts` processes, none empty."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _loadgen_argv(server: Server, spec: LoadSpec, concurrency: int, connections: int) -> list[str]:
    extra = []
    if connections > 1:
        extra += ["--connections", str(connections)]
    if (spec.model, spec.features) != (MODEL, INPUT_FEATURES):
        extra += ["--model", spec.model, "--features", str(spec.features)]
    return python_script(
        "loadgen.py",
        "--target",
        server.target,
        "--concurrency",
        str(concurrency),
        "--client",
        spec.client,
        "--warmup",
        str(spec.warmup_s),
        "--duration",
        str(spec.duration_s),
        "--timeout",
        str(spec.timeout_s),
        *extra,
    )


def _sleep_until(t_ns: int) -> None:
    delay = (t_ns - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


def measure(
    procs: ProcessGroup,
    server: Server,
    spec: LoadSpec,
    idle: list[Server],
    observer: WindowObserver | None = None,
) -> dict[str, Any]:
    """Drive `server` as `spec` says; `idle` servers are watched for CPU they should not use."""
    calls = split(spec.concurrency, spec.client_procs)
    connections = split(max(spec.connections, len(calls)), len(calls))
    gens = [
        procs.start(_loadgen_argv(server, spec, n, k), stdin=subprocess.PIPE, cpus=spec.cpus)
        for n, k in zip(calls, connections, strict=True)
    ]
    try:
        for gen in gens:
            line = read_line(gen, _READY_TIMEOUT_S).strip()
            if line != "READY":
                raise RuntimeError(f"load generator said {line!r}, expected READY")
        t_start = time.monotonic_ns() + _GO_DELAY_NS
        for gen in gens:
            assert gen.stdin is not None
            gen.stdin.write(f"GO {t_start}\n")
            gen.stdin.flush()
        t0 = t_start + int(spec.warmup_s * 1e9)
        t1 = t0 + int(spec.duration_s * 1e9)
        watch = [("server", server.pid), *server.parts, *(("client", g.pid) for g in gens)]
        watch += [("idle_servers", s.pid) for s in idle]
        watch += [("idle_servers", pid) for s in idle for _, pid in s.parts]
        _sleep_until(t0)
        before = CpuSample.take(watch)
        if observer is not None:
            observer.window_started(server, spec.duration_s)
        _sleep_until(t1)
        after = CpuSample.take(watch)
        if observer is not None:
            observer.window_ended()
        reports = [
            json.loads(read_line(gen, spec.duration_s + spec.warmup_s + 60.0)) for gen in gens
        ]
    finally:
        for gen in gens:
            procs.stop(gen)
    return _combine(server, spec, reports, cpu_between(before, after))


def _combine(
    server: Server, spec: LoadSpec, reports: list[dict[str, Any]], cpu: dict[str, float]
) -> dict[str, Any]:
    latencies = [ns for r in reports for ns in r["latencies_ns"]]
    errors: dict[str, int] = {}
    for r in reports:
        for code, count in r["errors"].items():
            errors[code] = errors.get(code, 0) + count
    ok = len(latencies)
    window = spec.duration_s
    names = ["server", *(role for role, _ in server.parts), "client"]
    per_request = {f"{name}_us": cpu[name] / ok * 1e6 if ok else None for name in names}
    return {
        "server": server.name,
        "concurrency": spec.concurrency,
        "client": spec.client,
        "client_procs": len(reports),
        "connections": sum(r.get("connections", 1) for r in reports),
        "window_s": window,
        "ok": ok,
        "rps": ok / window,
        "errors": errors,
        "latency_us": summarize_ns(latencies),
        "request_bytes": reports[0]["request_bytes"],
        "reply_bytes": reports[0]["reply_bytes"],
        "cpu_s": cpu,
        "cpu_per_request": per_request,
        "other_cpu_cores": cpu["other"] / window,
        # Cyclic garbage the load generators collected after their window (the collector
        # is off during it: loadgen._collector_off).
        "client_deferred_garbage": sum(r.get("deferred_garbage", 0) for r in reports),
    }
