"""The dynamic batcher on a pure NumPy run function: joining, deadlines, limits, splitting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
import pytest

from tensord.batching.batcher import BatchingSettings, DynamicBatcher
from tensord.errors import DeadlineExceededError, ResourceExhaustedError, UnavailableError
from tensord.executor.base import RunResult
from tensord.executor.cpu import join_into


class Recorder:
    """Runs y = 3x + row-count on joined batches; can hold runs until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.ran = asyncio.Event()
        """Set once a batch has begun."""
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, parts: list[dict[str, np.ndarray]], names: Sequence[str]) -> RunResult:
        self.batches.append([p["x"].shape[0] for p in parts])
        self.ran.set()
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


DELAY_S = 0.5
"""The queue delay of the two-arrival tests; the second request comes 0.4 s after the
first, so a deadline renewed by it would close the batch 0.4 s late: that much room for a
loaded host's late wake-up."""


async def two_arrivals(
    batcher: DynamicBatcher,
) -> tuple[float, float, asyncio.Task[RunResult], asyncio.Task[RunResult]]:
    """When it started, when the second request was sent, and two requests of one kind,
    the second 0.4 s after the first."""
    start = time.monotonic()
    a = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.4)
    second = time.monotonic()
    b = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    return start, second, a, b


async def test_one_monotonic_deadline_per_batch() -> None:
    rec = Recorder()
    batcher = make(rec, max_queue_delay_s=DELAY_S)
    start, second, a, b = await two_arrivals(batcher)
    await asyncio.gather(a, b)
    closed = time.monotonic()
    # Closed DELAY_S after the first arrival, before a deadline renewed by the second.
    assert start + DELAY_S <= closed < second + DELAY_S, (closed - start, second - start)
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


async def test_cancelled_and_expired_requests_hold_no_place_in_the_queue() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec, max_queue_size=2)
    running = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)  # the only instance is busy: the next ones queue
    cancelled = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    with pytest.raises(DeadlineExceededError):
        await batcher.submit(rows(1), ["y"], time.monotonic() + 0.02)
    cancelled.cancel()
    await asyncio.sleep(0.01)
    assert batcher.queue_depth == 0
    live = [asyncio.create_task(batcher.submit(rows(1), ["y"], None)) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert batcher.queue_depth == 2 and batcher.stats.rejected == 0
    rec.gate.set()
    await asyncio.gather(running, *live)
    assert rec.batches == [[1], [1, 1]]


async def test_a_full_batch_does_not_wait_for_another_kinds_delay() -> None:
    rec = Recorder()
    batcher = make(rec, max_batch_size=4, max_queue_delay_s=0.5, instances=2)
    start = time.monotonic()
    narrow = asyncio.create_task(batcher.submit(rows(1, width=2), ["y"], None))
    await asyncio.sleep(0.01)
    await batcher.submit(rows(4, width=3), ["y"], None)  # full at once
    # Waiting for the narrow batch's delay would take all of its 0.5 s (timers never
    # fire early): anything less did not wait.
    assert time.monotonic() - start < 0.5
    await narrow  # its own batch closes at its own deadline, not a second delay later
    assert 0.5 <= time.monotonic() - start < 1.0
    assert rec.batches == [[4], [1]]


async def test_a_backlog_fills_the_largest_preferred_size() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec, preferred_batch_size=(2, 6), max_queue_delay_s=30.0)
    first = asyncio.create_task(batcher.submit(rows(2), ["y"], None))  # preferred: runs
    await asyncio.sleep(0.01)
    backlog = [asyncio.create_task(batcher.submit(rows(1), ["y"], None)) for _ in range(7)]
    await asyncio.sleep(0.01)
    rec.gate.set()
    await first
    await asyncio.wait_for(asyncio.gather(*backlog[:6]), 5)
    assert rec.batches == [[2], [1] * 6]  # 6, not three batches of 2
    await batcher.close()
    with pytest.raises(UnavailableError):  # the seventh waited for its delay
        await backlog[6]


async def test_the_deadline_stays_when_the_first_request_leaves() -> None:
    rec = Recorder()
    batcher = make(rec, max_queue_delay_s=DELAY_S)
    start, second, a, b = await two_arrivals(batcher)
    await asyncio.sleep(0.02)
    a.cancel()
    await b
    closed = time.monotonic()
    # The batch a opened closes DELAY_S after a arrived, not DELAY_S after b.
    assert start + DELAY_S <= closed < second + DELAY_S, (closed - start, second - start)
    assert rec.batches == [[1]]


async def test_a_request_ended_at_its_deadline_by_grpc_counts_as_expired() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec)
    running = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    await asyncio.sleep(0.01)  # holds the only instance
    queued = asyncio.create_task(batcher.submit(rows(1), ["y"], time.monotonic() + 0.05))
    await asyncio.sleep(0.01)
    # The loop blocked on purpose: the deadline passes before the batcher's timer can run...
    time.sleep(0.06)  # noqa: ASYNC251 - blocks the loop on purpose
    queued.cancel()  # ...and gRPC, whose own timer came first, cancels the call
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert batcher.stats.expired == 1
    rec.gate.set()
    await running


async def test_a_request_that_expires_while_its_batch_runs_is_not_served() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = make(rec, max_queue_delay_s=0.01)
    kept = asyncio.create_task(batcher.submit(rows(1), ["y"], None))
    late = asyncio.create_task(batcher.submit(rows(2), ["y"], time.monotonic() + 0.3))
    async with asyncio.timeout(5):  # the batch closes after 0.01 s, well before late's deadline
        await rec.ran.wait()
    assert rec.batches == [[1, 2]]  # joined, and running
    with pytest.raises(DeadlineExceededError):
        await late
    rec.gate.set()
    await kept
    stats = batcher.stats
    assert (stats.batches, stats.requests, stats.rows, stats.expired) == (1, 1, 1, 1)
    assert stats.batch_sizes == {3: 1}  # what ran
