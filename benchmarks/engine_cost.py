"""The engine process's own CPU per Predict, without another process: where the floor is.

    python benchmarks/engine_cost.py [--requests 6000] [--in-flight 32]

In one process and one event loop, a stand-in frontend posts batch-1 Predict messages to
an EngineHost over real rings and reads the replies, `--in-flight` at a time, on the null
model (`null_model.py`) and its batched twin. Printed per request, in µs of CPU:
  data plane   DataPlane.predict alone (validation, executor or batcher, lanes)
  engine       the same through the rings, as a frontend sends it (its tensors checked
               against the signature already): decode, task, data plane, encode, writes
  frontend     what the stand-in frontend's side of the link costs (encode, decode)
so `engine - data plane` is what the link adds in Python, and what a real run measures
beyond `engine` is the cost of waking processes and threads on the machine
(`ring_bench.py` measures that alone).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import use_venv  # noqa: F401  (re-runs this script under .venv when needed)
from null_model import build_null_repository

from tensord import heap
from tensord.config import load_config
from tensord.dataplane import DataPlane, LocalEngine, PredictCall
from tensord.eventloop import run
from tensord.procs import messages
from tensord.procs.engine import EngineHost
from tensord.procs.link import Link
from tensord.procs.ring import Ring

INPUT = np.zeros((1, 16), np.float32)


async def data_plane_alone(dataplane: DataPlane, model: str, n: int, in_flight: int) -> float:
    async def worker(count: int) -> None:
        for _ in range(count):
            await dataplane.predict(PredictCall(model, 0, [("input", INPUT)], [], None))

    start = time.process_time()
    await asyncio.gather(*(worker(n // in_flight) for _ in range(in_flight)))
    return (time.process_time() - start) / n * 1e6


async def through_rings(engine: LocalEngine, model: str, n: int, in_flight: int) -> float:
    requests, replies = Ring.create(1 << 24), Ring.create(1 << 24)
    host = EngineHost(engine)
    host.add_frontend(0, Ring.attach(*_dup(replies)), Ring.attach(*_dup(requests)))
    waiting: dict[int, asyncio.Future[Any]] = {}

    def received(message: messages.Message) -> None:
        for each in message.messages if isinstance(message, messages.Batch) else [message]:
            answer = isinstance(each, messages.Result | messages.Error)
            future = waiting.pop(each.id, None) if answer else None  # type: ignore[union-attr]
            if future is not None:
                future.set_result(each)

    frontend = Link(requests, replies, received)
    frontend.open()
    ids = itertools.count()

    async def worker(count: int) -> None:
        for _ in range(count):
            call_id = next(ids)
            future = asyncio.get_running_loop().create_future()
            waiting[call_id] = future
            # As a frontend sends it: checked against version 1's signature already.
            call = PredictCall(model, 1, [("input", INPUT)], ["output"], None)
            frontend.post(messages.predict(call_id, call))
            reply = await future
            assert isinstance(reply, messages.Result), reply
            messages.result_of(reply)

    start = time.process_time()
    await asyncio.gather(*(worker(n // in_flight) for _ in range(in_flight)))
    cost = (time.process_time() - start) / n * 1e6
    host.close()
    frontend.close()
    return cost


def _dup(ring: Ring) -> tuple[int, int, int]:
    import os

    memory, event, space = ring.fds()
    return os.dup(memory), os.dup(event), os.dup(space)


async def main_async(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="tensord-engine-cost-"))
    build_null_repository(root)
    config = load_config(None, env={}, overrides={"model_repository": str(root)})
    engine = LocalEngine.for_config(config)
    dataplane = DataPlane(engine, config)
    await dataplane.load_models()
    dataplane.serving = True
    heap.tune()
    heap.settle()
    print("| model | data plane µs | engine through rings µs (incl. stand-in frontend) |")
    print("| --- | --- | --- |")
    for model in ("null", "null_batched"):
        await data_plane_alone(dataplane, model, args.requests // 4, args.in_flight)  # warm
        alone = min([await data_plane_alone(dataplane, model, args.requests, args.in_flight)
                     for _ in range(3)])  # fmt: skip
        rings = min([await through_rings(engine, model, args.requests, args.in_flight)
                     for _ in range(3)])  # fmt: skip
        print(f"| {model} | {alone:.1f} | {rings:.1f} |")
    await dataplane.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--in-flight", type=int, default=32)
    args = parser.parse_args()
    run(main_async(args), "auto")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
