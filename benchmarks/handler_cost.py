"""The daemon's own Predict path with gRPC left out: event-loop CPU per request.

    python benchmarks/handler_cost.py [--concurrency 1,64] [--requests 6000] [--batching]

It starts the daemon in-process on the demo repository (as `tensord serve` does: uvloop,
its logging set-up, GIL switch interval and collector settings, models loaded and
warmed, the long-lived heap frozen), then calls the Predict handler directly, with the
servicer's own decorator, on requests parsed from the same bytes as predict_bench.py
sends, `--concurrency` callers at a time. It reports the CPU the event loop's thread
spends per request (time.thread_time: user + system) and the rate. The model's runs
happen on the lanes, so the figure is the daemon's Python (decode, validate, queue,
hand-off, encode) plus the event loop's share of the hand-off; the gap to what the
served daemon spends per request on that thread is grpc.aio's per-call work. The call
context is a minimal stand-in (no metadata, a 30 s deadline): this measures the
handler's cost, it does not test serving.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# use_venv comes first: it re-runs this script under .venv when grpcio/tensord are missing.
import use_venv  # noqa: F401
from payloads import MODEL, request_bytes
from predict_bench import DEFAULT_REPOSITORY, batching_copy, ensure_repository

from tensord import heap
from tensord.config import load_config
from tensord.eventloop import run as run_loop
from tensord.logs import configure_logging
from tensord.server.app import TensordServer
from tensord.server.tensord_v1.servicer import InferenceServicer


class _Context:
    """What the handler reads from a ServicerContext, and nothing else: the request's bytes
    (the intake parses them, as on the served path), no metadata, a 30 s deadline."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def read(self) -> bytes:
        return self._data

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    def time_remaining(self) -> float:
        return 30.0

    async def abort(self, code: Any, message: str, trailing_metadata: Any = ()) -> None:
        raise RuntimeError(f"{code}: {message}")


async def _measure(repository: Path, levels: list[int], requests: int) -> None:
    config = load_config(
        env={}, overrides={"model_repository": str(repository), "server.listen": "127.0.0.1:0"}
    )
    configure_logging("json", "warning")
    server = TensordServer(config)
    server.adopt_process_settings()
    await server.start()
    try:
        servicer = InferenceServicer(server.dataplane)
        data = request_bytes()
        context = _Context(data)

        async def caller(calls: int) -> None:
            for _ in range(calls):
                reply = await servicer.Predict(None, context)
                reply.SerializeToString()

        for level in levels:
            per_caller = max(1, requests // level)
            await asyncio.gather(*(caller(max(1, 200 // level)) for _ in range(level)))
            heap.settle()  # the warm-up's garbage, as after a reload
            cpu, wall = time.thread_time(), time.perf_counter()
            await asyncio.gather(*(caller(per_caller) for _ in range(level)))
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            done = per_caller * level
            print(
                f"{level:4d} in flight: {cpu / done * 1e6:7.1f} us of event-loop CPU per "
                f"request, {done / wall:8,.0f} req/s ({done} requests)",
                flush=True,
            )
    finally:
        await server.stop(grace=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,64", help="callers at once (1,64)")
    parser.add_argument("--requests", type=int, default=6000, help="per level (6000)")
    parser.add_argument("--batching", action="store_true", help="mlp with dynamic batching")
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    repository = ensure_repository(args.model_repository)
    with tempfile.TemporaryDirectory(prefix="tensord-handler-") as scratch:
        if args.batching:
            repository = batching_copy(repository, Path(scratch))
        print(f"Predict handler, batch-1 requests to {MODEL!r}, gRPC left out", flush=True)
        run_loop(_measure(repository, levels, args.requests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
