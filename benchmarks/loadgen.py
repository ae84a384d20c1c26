"""The load generator: N workers sending back-to-back batch-1 Predict calls on K channels.

Run as a subprocess, one or more per measurement point, so that its CPU use is its own
and comparable between servers. The identical code and bytes go to the tensord daemon
and to the echo server: the request is pre-serialised and the reply is kept as bytes
(no protobuf work on the client), which keeps the client as cheap as grpcio allows.

Two drivers, both on one channel (one HTTP/2 connection) unless --connections says more:
  aio   grpc.aio, N asyncio tasks. The cheapest per call once several are in flight.
  sync  the blocking API, N threads. At one call in flight it has ~30 % less latency
        than aio (no hop from grpc's poller to the event loop); with many threads the
        GIL makes it worse than aio. predict_bench.py picks per point (see README).

--connections K spreads the N workers over K channels, each its own TCP connection (a
local subchannel pool per channel, so grpc does not share one connection between them);
worker i uses channel i mod K, and K is capped at N. A server whose processes share the
port with SO_REUSEPORT gets connections, not calls, balanced between them: loading it
needs several. --model and --features pick the request (default: the demo `mlp`'s).

Protocol on stdin/stdout (so several processes start their windows together):
  1. it connects, retries Predict until it succeeds (the daemon answers UNAVAILABLE
     while it loads models), makes a few more calls, and prints `READY`;
  2. it reads `GO <t_start_ns>` (a time.monotonic_ns() value, one clock for every
     process on Linux), sends from t_start, and measures from t_start + warm-up for
     the window's duration; calls completing inside the window count;
  3. it prints one JSON line: completions, their latencies (ns), errors, its own CPU.
With --ready-only it stops after step 1 (the benchmark's readiness probe).
End of stdin before GO means the benchmark went away: it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from payloads import INPUT_FEATURES, MODEL, PREDICT_PATH, request_bytes

from tensord.eventloop import run

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),
    # Reconnect quickly while a server is still starting.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
_SEPARATE_CONNECTION = ("grpc.use_local_subchannel_pool", 1)
"""Given to each channel when there are several: each then opens its own connection."""
_READY_TIMEOUT_S = 120.0
_PROBE_CALLS = 20
_LOCK = threading.Lock()


@dataclass(slots=True)
class Window:
    """The measurement window [t0, t1) in monotonic ns, and what completed inside it."""

    t0: int
    t1: int
    latencies_ns: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    deferred_garbage: int = 0
    """Objects the collector freed after the window (it was off during it)."""

    def result(
        self, concurrency: int, connections: int, cpu_s: float, payload: bytes, reply: bytes
    ) -> dict[str, Any]:
        """The JSON-able report for the benchmark."""
        return {
            "concurrency": concurrency,
            "connections": connections,
            "window_s": (self.t1 - self.t0) / 1e9,
            "ok": len(self.latencies_ns),
            "errors": dict(self.errors),
            "latencies_ns": self.latencies_ns,
            "calls_total": self.calls,
            "deferred_garbage": self.deferred_garbage,
            "cpu_s_total": cpu_s,
            "request_bytes": len(payload),
            "reply_bytes": len(reply),
        }


def _parse_go(line: str) -> int:
    verb, _, value = line.strip().partition(" ")
    if not line:
        raise SystemExit("loadgen: stdin closed before GO; exiting")
    if verb != "GO":
        raise RuntimeError(f"expected 'GO <t_start_ns>', got {line!r}")
    return int(value)


def _window(t_start: int, args: argparse.Namespace) -> Window:
    t0 = t_start + int(args.warmup * 1e9)
    return Window(t0, t0 + int(args.duration * 1e9))


def _sleep_until(t_ns: int) -> float:
    return max(t_ns - time.monotonic_ns(), 0) / 1e9


def connection_count(args: argparse.Namespace) -> int:
    """Channels to open: --connections, at most one per call in flight."""
    return max(1, min(args.connections, args.concurrency))


def channel_options(connections: int) -> list[list[tuple[str, Any]]]:
    """Options of each channel: today's single channel unchanged, or with several a local
    subchannel pool each, so that each opens its own TCP connection."""
    if connections == 1:
        return [_CHANNEL_OPTIONS]
    return [[*_CHANNEL_OPTIONS, _SEPARATE_CONNECTION] for _ in range(connections)]


@contextlib.contextmanager
def _collector_off(window: Window) -> Iterator[None]:
    """No cyclic garbage collection in this process from the warm-up to the end of the
    window (as timeit does). Left on, the client's own collections (up to ~18 ms for a
    full one) stopped every call in flight, and the pause counted as server latency.
    Whatever cyclic garbage piled up is collected afterwards and counted
    (`deferred_garbage`; grpc's client calls leave none in practice)."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
        window.deferred_garbage = gc.collect()


# ---------------------------------------------------------------- aio driver


async def _aio_worker(call: Any, payload: bytes, window: Window, deadline_s: float | None) -> None:
    """Back-to-back calls until t1, each with a gRPC deadline of `deadline_s` (None: none);
    record those that complete within the window."""
    clock = time.monotonic_ns
    t0, t1 = window.t0, window.t1
    latencies = window.latencies_ns
    while True:
        start = clock()
        if start >= t1:
            return
        try:
            await call(payload, timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            if t0 <= clock() < t1:
                window.errors[exc.code().name] += 1
            continue
        end = clock()
        window.calls += 1
        if t0 <= end < t1:
            latencies.append(end - start)


async def _aio_ready(call: Any, payload: bytes) -> bytes:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while True:
        try:
            reply: bytes = await call(payload, timeout=10.0)
            break
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    for _ in range(_PROBE_CALLS):
        reply = await call(payload, timeout=10.0)
    return reply


async def run_aio(args: argparse.Namespace) -> dict[str, Any]:
    """The aio driver: `connections` channels, `concurrency` tasks spread over them."""
    payload = request_bytes(args.model, args.features)
    deadline_s = args.timeout if args.timeout > 0 else None
    async with contextlib.AsyncExitStack() as stack:
        calls = []
        for options in channel_options(connection_count(args)):
            channel = await stack.enter_async_context(
                grpc.aio.insecure_channel(args.target, options=options)
            )
            calls.append(channel.unary_unary(PREDICT_PATH, _registered_method=True))
        for call in calls:
            reply = await _aio_ready(call, payload)
        print("READY", flush=True)
        if args.ready_only:
            return {}
        window = _window(_parse_go(await asyncio.to_thread(sys.stdin.readline)), args)
        await asyncio.sleep(_sleep_until(window.t0 - int(args.warmup * 1e9)))
        with _collector_off(window):
            cpu0 = time.process_time()
            await asyncio.gather(
                *(
                    _aio_worker(calls[i % len(calls)], payload, window, deadline_s)
                    for i in range(args.concurrency)
                )
            )
            cpu = time.process_time() - cpu0
    return window.result(args.concurrency, len(calls), cpu, payload, reply)


# --------------------------------------------------------------- sync driver


def _sync_worker(
    call: Callable[..., bytes], payload: bytes, window: Window, deadline_s: float | None
) -> None:
    """Blocking twin of _aio_worker; list.append is atomic under the GIL, counters locked."""
    clock = time.monotonic_ns
    t0, t1 = window.t0, window.t1
    latencies = window.latencies_ns
    calls = 0
    while True:
        start = clock()
        if start >= t1:
            break
        try:
            call(payload, timeout=deadline_s)
        except grpc.RpcError as exc:
            if t0 <= clock() < t1:
                with _LOCK:
                    window.errors[exc.code().name] += 1
            continue
        end = clock()
        calls += 1
        if t0 <= end < t1:
            latencies.append(end - start)
    with _LOCK:
        window.calls += calls


def _sync_ready(call: Callable[..., bytes], payload: bytes) -> bytes:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while True:
        try:
            reply = call(payload, timeout=10.0)
            break
        except grpc.RpcError as exc:
            code = exc.code()
            if code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    for _ in range(_PROBE_CALLS):
        reply = call(payload, timeout=10.0)
    return reply


def run_sync(args: argparse.Namespace) -> dict[str, Any]:
    """The blocking driver: `connections` channels, `concurrency` threads spread over them
    (the caller's thread, when one call is in flight)."""
    payload = request_bytes(args.model, args.features)
    deadline_s = args.timeout if args.timeout > 0 else None
    with contextlib.ExitStack() as stack:
        calls = []
        for options in channel_options(connection_count(args)):
            channel = stack.enter_context(grpc.insecure_channel(args.target, options=options))
            calls.append(channel.unary_unary(PREDICT_PATH, _registered_method=True))
        for call in calls:
            reply = _sync_ready(call, payload)
        print("READY", flush=True)
        if args.ready_only:
            return {}
        window = _window(_parse_go(sys.stdin.readline()), args)
        time.sleep(_sleep_until(window.t0 - int(args.warmup * 1e9)))
        with _collector_off(window):
            cpu0 = time.process_time()
            if args.concurrency == 1:
                _sync_worker(calls[0], payload, window, deadline_s)
            else:
                threads = [
                    threading.Thread(
                        target=_sync_worker,
                        args=(calls[i % len(calls)], payload, window, deadline_s),
                    )
                    for i in range(args.concurrency)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            cpu = time.process_time() - cpu0
    return window.result(args.concurrency, len(calls), cpu, payload, reply)


def main() -> int:
    """Parse the flags, run the chosen driver, print the JSON result line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True, help="HOST:PORT of the server")
    parser.add_argument("--concurrency", type=int, default=1, help="calls in flight")
    parser.add_argument(
        "--connections",
        type=int,
        default=1,
        help="channels (TCP connections) the calls spread over, at most one per call (1)",
    )
    parser.add_argument("--model", default=MODEL, help=f"the model called ({MODEL})")
    parser.add_argument(
        "--features",
        type=int,
        default=INPUT_FEATURES,
        help=f"float32 values of the batch-1 input ({INPUT_FEATURES})",
    )
    parser.add_argument(
        "--ready-only", action="store_true", help="exit after READY (a readiness probe)"
    )
    parser.add_argument("--client", choices=["aio", "sync"], default="aio", help="driver")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before the window")
    parser.add_argument("--duration", type=float, default=5.0, help="window length, seconds")
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="per-call deadline, s (the client's default); 0: none",
    )
    args = parser.parse_args()
    if args.connections < 1:
        parser.error("--connections: must be >= 1")
    # aio runs on the daemon's default loop (uvloop where installed): the cheapest per call.
    report = run(run_aio(args)) if args.client == "aio" else run_sync(args)
    if report:
        write_line(json.dumps(report))
    return 0


def write_line(text: str) -> None:
    """Write one line to stdout whole, however long.

    A write to a full pipe can return early when a signal arrives (grpc's threads send
    some), and print() then loses the rest of a line longer than the pipe's 64 KiB; the
    report at thousands of calls/s is longer. os.write in a loop writes what is left.
    """
    sys.stdout.flush()
    view = memoryview((text + "\n").encode())
    while view:
        view = view[os.write(sys.stdout.fileno(), view) :]


if __name__ == "__main__":
    sys.exit(main())
