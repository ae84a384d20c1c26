"""The CPU executor's interface and its host pool's accounting."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from tensord.backends.base import BackendPlacement, TensorSpec
from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.cuda.pools import ALIGNMENT, HostBufferPool, SizeClassPool, size_class
from tensord.dtypes import DType
from tensord.errors import (
    DeadlineExceededError,
    InternalError,
    OutOfMemoryError,
    UnavailableError,
)
from tensord.executor.base import RunResult
from tensord.executor.cpu import CpuExecutor, join_into
from tensord.executor.split import run_splitting_on_oom, split_rows
from tensord.modelconfig.model import ModelConfig
from tests.models import build_slow


def test_size_classes() -> None:
    assert [size_class(n) for n in (0, 1, 4096, 4097, 10_000, 1 << 20)] == [
        4096, 4096, 4096, 8192, 16384, 1 << 20,
    ]  # fmt: skip


def test_pool_reuses_and_counts() -> None:
    pool = HostBufferPool(max_cached_bytes=16384)
    a = pool.acquire(5000)
    b = pool.acquire(100)
    assert (a.nbytes, b.nbytes) == (8192, 4096)
    assert a.ctypes.data % ALIGNMENT == 0 and b.ctypes.data % ALIGNMENT == 0
    s = pool.stats()
    assert (s.in_use_bytes, s.cached_bytes, s.high_water_bytes, s.allocations, s.reuses) == (
        12288, 0, 12288, 2, 0,
    )  # fmt: skip
    pool.release(a)
    pool.release(b)
    again = pool.acquire(8000)
    assert again.ctypes.data == a.ctypes.data  # the same buffer came back
    s = pool.stats()
    assert (s.in_use_bytes, s.cached_bytes, s.high_water_bytes, s.allocations, s.reuses) == (
        8192, 4096, 12288, 2, 1,
    )  # fmt: skip
    pool.release(again)
    big = pool.acquire(16384)
    # 8192 + 4096 cached already: over the 16 KiB cap, but kept (freeing a device buffer
    # would stall the device mid-batch) until trim(), which frees the largest first.
    pool.release(big)
    assert pool.stats().cached_bytes == 12288 + 16384
    freed: list[int] = []
    counted = SizeClassPool(lambda n: n, freed.append, lambda n: n, max_cached_bytes=16384)
    for size in (8192, 4096, 16384):
        counted.release(counted.acquire(size))
    assert freed == [] and counted.stats().cached_bytes == 28672
    assert counted.trim() == 16384 and freed == [16384]
    assert counted.stats().cached_bytes == 12288 and counted.trim() == 0
    assert pool.trim() == 16384
    pool.clear()
    assert pool.stats().cached_bytes == 0


def test_out_of_memory_frees_the_cache_and_tries_once_more() -> None:
    """An allocation that fails for want of memory frees every cached buffer (other size
    classes may hold what it needs) and tries again once; with nothing cached it fails."""
    capacity = [32768]
    freed: list[int] = []

    def alloc(n: int) -> int:
        if n > capacity[0]:
            raise OutOfMemoryError(f"out of memory allocating {n} bytes")
        capacity[0] -= n
        return n

    def free(n: int) -> None:
        freed.append(n)
        capacity[0] += n

    pool = SizeClassPool(alloc, free, lambda n: n)
    for size in (8192, 16384):
        pool.release(pool.acquire(size))
    assert capacity[0] == 8192 and pool.stats().cached_bytes == 24576
    assert pool.acquire(32768) == 32768  # freed both cached buffers, then allocated
    assert sorted(freed) == [8192, 16384] and pool.stats().cached_bytes == 0
    with pytest.raises(OutOfMemoryError):
        pool.acquire(4096)  # nothing cached to free
    s = pool.stats()
    assert (s.in_use_bytes, s.allocations) == (32768, 3)


def test_an_idle_executor_trims_its_pools() -> None:
    """The CPU executor trims when its last run ends, off the hot path."""

    class Echo:
        def run(self, inputs: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
            return [inputs["x"]]

        def close(self) -> None:
            pass

    executor = CpuExecutor("echo", Echo(), lanes=1)  # type: ignore[arg-type]
    executor._host._max_cached = 0  # every released buffer is beyond the cap
    try:
        parts = [{"x": np.ones((64, 64), np.float32)} for _ in range(2)]  # joined: pooled
        asyncio.run(executor.run(parts, ["y"], None))
        deadline = time.monotonic() + 5
        while executor.stats().pools["host"].cached_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert executor.stats().pools["host"].cached_bytes == 0
    finally:
        executor.close()


def test_join_into_pooled_buffers() -> None:
    pool = HostBufferPool()
    taken: list[np.ndarray] = []

    def take(n: int) -> np.ndarray:
        taken.append(pool.acquire(n))
        return taken[-1]

    parts = [
        {"x": np.full((2, 3), i, np.float32), "s": np.array([f"a{i}", "b"], dtype=object)}
        for i in range(3)
    ]
    joined = join_into(parts, take)
    assert joined["x"].tolist() == [[0.0] * 3] * 2 + [[1.0] * 3] * 2 + [[2.0] * 3] * 2
    assert joined["s"].tolist() == ["a0", "b", "a1", "b", "a2", "b"]
    assert len(taken) == 1 and np.shares_memory(joined["x"], taken[0])
    single = join_into(parts[:1], take)
    assert single["x"] is parts[0]["x"] and len(taken) == 1


class Doubler:
    """A NumPy backend: y = 2x, optionally slow, failing on negative input."""

    placement = BackendPlacement("numpy", "CPU", "test", ("CPU",))

    def __init__(self, delay: float = 0.0) -> None:
        self.inputs = [TensorSpec("x", DType.FLOAT32, (-1, 2))]
        self.outputs = [TensorSpec("y", DType.FLOAT32, (-1, 2))]
        self.delay = delay
        self.threads: set[str] = set()

    def run(self, inputs: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        if (inputs["x"] < 0).any():
            raise InternalError("negative input")
        return [inputs["x"] * 2]

    def terminate_runs(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_executor_runs_joins_and_counts() -> None:
    # Each run outlasts a lane thread's late wake-up on a loaded host by far, so the two
    # lanes share the four runs evenly.
    backend = Doubler(delay=0.2)
    executor = CpuExecutor("m", backend, lanes=2)
    parts = [{"x": np.ones((1, 2), np.float32)}, {"x": np.full((2, 2), 3, np.float32)}]
    results = await asyncio.gather(*(executor.run(parts, ["y"]) for _ in range(4)))
    for result in results:
        assert result.outputs[0].tolist() == [[2, 2], [6, 6], [6, 6]]
        assert result.compute_s >= 0.2 and result.queue_s >= 0
    stats = executor.stats()
    assert stats.kind == "cpu" and len(stats.lanes) == 2
    assert [lane.runs for lane in stats.lanes] == [2, 2]
    assert all(lane.busy_s >= 0.4 for lane in stats.lanes)
    assert (stats.queue_depth, stats.running) == (0, 0)
    host = stats.pools["host"]
    assert host.in_use_bytes == 0 and host.allocations >= 1 and host.high_water_bytes >= 4096
    assert len(backend.threads) == 2
    with pytest.raises(InternalError):
        await executor.run([{"x": -np.ones((1, 2), np.float32)}], ["y"])
    assert sum(lane.failed for lane in executor.stats().lanes) == 1
    assert executor.stats().pools["host"].in_use_bytes == 0
    executor.close()


async def until(condition: Callable[[], object]) -> None:
    """Until `condition()` holds, within 5 s: the lanes change the executor's stats on
    their own threads, and nothing tells the event loop when."""
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - lane threads change it; no event to await
            await asyncio.sleep(0.005)


async def until_running(executor: CpuExecutor) -> None:
    """Until a lane has taken a run (a lane thread may wake late on a loaded host)."""
    await until(lambda: executor.stats().running)


async def test_executor_deadline_in_queue() -> None:
    executor = CpuExecutor("m", Doubler(delay=0.5), lanes=1)
    x = {"x": np.ones((1, 2), np.float32)}
    held = asyncio.create_task(executor.run([x], ["y"]))
    await until_running(executor)
    with pytest.raises(DeadlineExceededError):
        await executor.run([x], ["y"], deadline=time.monotonic() + 0.05)
    await held
    await asyncio.sleep(0.01)
    stats = executor.stats()
    assert stats.started == 1 and stats.queue_depth == 0
    executor.close()


class SmallMemory(Doubler):
    """Runs out of memory on batches of more than `limit` rows."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.sizes: list[int] = []

    def run(self, inputs: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        rows = inputs["x"].shape[0]
        self.sizes.append(rows)
        if rows > self.limit:
            raise OutOfMemoryError(f"out of memory for {rows} rows")
        return super().run(inputs, names)


def test_split_rows_cuts_inside_a_part() -> None:
    parts = [{"x": np.arange(6).reshape(3, 2)}, {"x": np.arange(4).reshape(2, 2) + 100}]
    left, right = split_rows(parts, 4)
    assert [p["x"].shape[0] for p in left] == [3, 1] and [p["x"].shape[0] for p in right] == [1]
    assert right[0]["x"].tolist() == [[102, 103]]


async def test_out_of_memory_splits_the_batch_in_half() -> None:
    backend = SmallMemory(limit=2)
    executor = CpuExecutor("m", backend, lanes=1)
    parts = [{"x": np.full((3, 2), i, np.float32)} for i in range(2)]  # 6 rows
    result = await run_splitting_on_oom(executor.run, parts, ["y"])
    assert result.outputs[0].tolist() == [[0, 0]] * 3 + [[2, 2]] * 3
    assert backend.sizes == [6, 3, 1, 2, 3, 1, 2]
    single = SmallMemory(limit=0)
    with pytest.raises(OutOfMemoryError):
        await run_splitting_on_oom(
            CpuExecutor("m", single, 1).run, [{"x": np.ones((1, 2), np.float32)}], ["y"]
        )
    executor.close()


async def one_running_one_queued(
    executor: CpuExecutor,
) -> tuple[asyncio.Task[RunResult], asyncio.Task[RunResult]]:
    """Two runs on a one-lane executor: the first on its lane, the second waiting."""
    x = {"x": np.ones((1, 2), np.float32)}
    running = asyncio.create_task(executor.run([x], ["y"]))
    await until_running(executor)
    queued = asyncio.create_task(executor.run([x], ["y"]))
    await asyncio.sleep(0.01)
    assert executor.stats().queue_depth == 1
    return running, queued


async def test_close_answers_queued_runs_unavailable() -> None:
    executor = CpuExecutor("m", Doubler(delay=0.3), lanes=1)
    running, queued = await one_running_one_queued(executor)
    executor.close()
    with pytest.raises(UnavailableError, match="unloaded before this request ran"):
        await asyncio.wait_for(queued, 1.0)
    assert (await running).outputs[0].tolist() == [[2, 2]]  # the run in progress finishes
    assert executor.stats().queue_depth == 0


async def test_a_deadline_that_passes_while_running_is_answered_on_time() -> None:
    executor = CpuExecutor("m", Doubler(delay=1.0), lanes=1)
    start = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await executor.run([{"x": np.ones((1, 2), np.float32)}], ["y"], time.monotonic() + 0.1)
    # Answered by the deadline, not when the run ends (1 s after it began, at the earliest):
    # it is still running.
    assert time.monotonic() - start < 1.0
    assert executor.stats().running == 1
    await until(lambda: not executor.stats().running)  # it ends; its answer goes nowhere
    executor.close()


async def test_a_cancelled_queued_run_never_runs() -> None:
    executor = CpuExecutor("m", Doubler(delay=0.2), lanes=1)
    running, queued = await one_running_one_queued(executor)
    queued.cancel()  # the client went away while it waited
    await asyncio.sleep(0)
    assert executor.stats().queue_depth == 0
    await running
    await asyncio.sleep(0.05)  # the lane has taken the dropped run off the queue by now
    assert executor.stats().started == 1  # the cancelled one never started
    executor.close()
    with pytest.raises(UnavailableError, match="unloaded"):  # after close: refused at once
        await executor.run([{"x": np.ones((1, 2), np.float32)}], ["y"])


def test_lanes_exit_when_closed() -> None:
    executor = CpuExecutor("closing", Doubler(), lanes=3)
    lanes = {"cpu-closing_0", "cpu-closing_1", "cpu-closing_2"}
    assert lanes <= {t.name for t in threading.enumerate()}
    executor.close()
    deadline = time.monotonic() + 5
    while lanes & {t.name for t in threading.enumerate()}:
        assert time.monotonic() < deadline, "lanes still running after close()"
        time.sleep(0.01)


async def test_terminate_runs_cuts_an_onnx_runtime_run_short(tmp_path: Path) -> None:
    # 96 MatMuls of [2048, 1024] x [1024, 1024]: seconds on one thread, ~0.05 s a node.
    model = build_slow(tmp_path / "slow.onnx")
    backend = OnnxRuntimeBackend(model, ModelConfig())
    executor = CpuExecutor("slow", backend, lanes=1)
    x = np.full((2048, 1024), 0.01, np.float32)
    long_run = asyncio.create_task(executor.run([{"x": x}], ["y"]))
    await until_running(executor)
    await asyncio.sleep(0.1)
    start = time.monotonic()
    executor.terminate_runs()
    with pytest.raises(UnavailableError, match="drain grace ran out"):
        await asyncio.wait_for(long_run, 30)
    # Stopped between nodes (~0.05 s each), not at the end (~5 s away).
    assert time.monotonic() - start < 2.0
    assert executor.stats().lanes[0].failed == 1
    # Only the runs in progress were flagged: the next one runs whole.
    (y,) = (await executor.run([{"x": x[:2]}], ["y"])).outputs
    assert y.shape == (2, 1024) and np.isfinite(y).all()
    executor.close()
