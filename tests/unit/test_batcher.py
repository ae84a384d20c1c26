"""The dynamic batcher on a pure NumPy run function: joining, deadlines, limits, splitting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
import pytest

from tensord.batching.batcher import BatchingSettings, DynamicBatcher
from tensord.errors import DeadlineExceededError, ResourceExhaustedError
from tensord.executor.base import RunResult
from tensord.executor.cpu import join_into


class Recorder:
    """Runs y = 3x + row-count on joined batches; can hold runs until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, parts: list[dict[str, np.ndarray]], names: Sequence[str]) -> RunResult:
        self.batches.append([p["x"].shape[0] for p in parts])
        await self.gate.wait()
        x = join_into(parts, lambda n: np.empty(n, np.uint8))["x"]
        return RunResult([x * 3], 0.0, 0.0)


def make(recorder: Recorder, **kw: object) -> DynamicBatcher:
    settings = BatchingSettings(**{"max_batch_size": 8, **kw})  # type: ignore[arg-type]
    return DynamicBatcher("m", settings, recorder)


def rows(n: int, start: float = 0.0, width: int = 2) -> dict[str, np.ndarray]:
    return {"x": (np.arange(n * width, dtype=np.float32).reshape(n, width) + start)}


async def test_outputs_are_split_back_per_request() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec)
    blocker = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)  # the first batch holds the only instance
    sizes = [3, 1, 2, 2]
    inputs = [rows(n, start=100 * i) for i, n in enumerate(sizes)]
    tasks = [asyncio.create_task(batcher.submit(x, ["y"], None)) for x in inputs]
    await asyncio.sleep(0.01)
    rec.gate.set()
    results = await asyncio.gather(blocker, *tasks)
    for x, result in zip(inputs, results[1:], strict=True):
        assert result.outputs[0].tobytes() == (x["x"] * 3).tobytes()
    assert rec.batches == [[1], [3, 1, 2, 2]]
    assert batcher.stats.batch_sizes == {1: 1, 8: 1}


async def test_max_batch_size_is_never_exceeded() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec)
    first = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)
    tasks = [asyncio.create_task(batcher.submit(rows(3), ["y"], None)) for _ in range(3)]
    await asyncio.sleep(0.01)
    rec.gate.set()
    await asyncio.gather(first, *tasks)
    assert rec.batches == [[1], [3, 3], [3]]


async def test_preferred_size_dispatches_at_once() -> None:
    rec = Recorder()
    batcher = make(rec, preferred_batch_size=(4,), max_queue_delay_s=30.0)
    start = time.monotonic()
    await asyncio.gather(*(batcher.submit(rows(1), ["y"], None) for _ in range(4)))
    assert time.monotonic() - start < 5
    assert rec.batches == [[1, 1, 1, 1]]


async def test_one_monotonic_deadline_per_batch() -> None:
    rec = Recorder()
    batcher = make(rec, max_queue_delay_s=0.3)
    start = time.monotonic()
    a = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.2)
    b = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.gather(a, b)
    elapsed = time.monotonic() - start
    # Closed 0.3 s after the first arrival, not 0.3 s after the second.
    assert 0.3 <= elapsed < 0.49  # a deadline renewed by the second arrival would be 0.5
    assert rec.batches == [[1, 1]]


async def test_incompatible_shapes_run_apart() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec)
    first = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)
    narrow = [asyncio.create_task(batcher.submit(rows(1, width=2), ["y"], None)) for _ in range(2)]
    wide = asyncio.create_task(batcher.submit(rows(1, width=3), ["y"], None))
    await asyncio.sleep(0.01)
    rec.gate.set()
    results = await asyncio.gather(first, *narrow, wide)
    assert rec.batches == [[1], [1, 1], [1]]
    assert results[-1].outputs[0].shape == (1, 3)


async def test_full_queue_is_refused_at_once() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec, max_queue_size=2)
    running = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)
    queued = [asyncio.create_task(batcher.submit(rows(1), ["y"], None)) for _ in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(
        ResourceExhaustedError, match=r"the queue of model 'm' is full \(2 requests"
    ):
        await batcher.submit(rows(1), ["y"], None)
    rec.gate.set()
    await asyncio.gather(running, *queued)
    assert batcher.stats.rejected == 1


async def test_expired_in_queue_never_runs() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec)
    running = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)
    with pytest.raises(DeadlineExceededError, match="deadline passed"):
        await batcher.submit(rows(2), ["y"], time.monotonic() + 0.05)
    rec.gate.set()
    await running
    await batcher.submit(rows(1), ["y"], None)
    assert rec.batches == [[1], [1]]


async def test_default_timeout_applies_without_a_deadline() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec, default_timeout_s=0.05)
    running = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)
    with pytest.raises(DeadlineExceededError):
        await batcher.submit(rows(1), ["y"], None)
    rec.gate.set()
    with pytest.raises(DeadlineExceededError):  # the held run itself outlived 0.05 s
        await running


async def test_cancelled_in_queue_never_runs() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec)
    running = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)
    doomed = asyncio.create_task(batcher.submit(rows(5), ["y"], None))
    await asyncio.sleep(0.01)
    doomed.cancel()
    rec.gate.set()
    await running
    await batcher.submit(rows(1), ["y"], None)
    assert rec.batches == [[1], [1]]
    assert batcher.queue_depth == 0


async def test_instances_run_batches_concurrently() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec, instances=2)
    tasks = []
    for _ in range(2):
        tasks.append(asyncio.create_task(batcher.submit(rows(1), ["y"], None)))
        await asyncio.sleep(0.01)
    assert len(rec.batches) == 2  # both started although neither finished
    rec.gate.set()
    await asyncio.gather(*tasks)
