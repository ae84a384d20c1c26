"""What every executor shares: worker threads as lanes, a queue with deadlines, counters.

A request still queued when its deadline passes never runs; one whose client goes away is
dropped from the queue. The event loop only awaits. Subclasses say how one batch runs on
one lane (`_execute`) and which buffer pools they keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from tensord.errors import DeadlineExceededError, UnavailableError
from tensord.executor.base import ExecutorStats, LaneStats, PoolStats, RunResult


class LaneExecutor:
    """`lanes` worker threads; lane i's thread always runs on lane i's resources."""

    kind = "lanes"

    def __init__(self, name: str, lanes: int, reason: str) -> None:
        self.reason = reason
        self._lane_stats = [LaneStats() for _ in range(lanes)]
        self._lane_ids = itertools.count()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._queued = 0
        self._running = 0
        self._pool = ThreadPoolExecutor(
            max_workers=lanes, thread_name_prefix=f"{self.kind}-{name}", initializer=self._bind_lane
        )

    def _bind_lane(self) -> None:
        self._local.lane = next(self._lane_ids)
        self._lane_started()

    def _lane_started(self) -> None:
        """Per-thread set-up of a lane (the CUDA executor selects its device)."""

    def _execute(
        self, lane: int, parts: Sequence[Mapping[str, np.ndarray]], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        """Run one batch on lane `lane` (blocking, on that lane's thread)."""
        raise NotImplementedError

    def _pools(self) -> dict[str, PoolStats]:
        return {}

    async def run(
        self,
        parts: Sequence[Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        deadline: float | None = None,
    ) -> RunResult:
        """Queue one run; `deadline` is a time.monotonic() value or None."""
        submitted = time.monotonic()
        loop = asyncio.get_running_loop()
        result: asyncio.Future[RunResult] = loop.create_future()
        with self._lock:
            self._queued += 1
        cfuture = self._pool.submit(self._run, parts, output_names, deadline, submitted)
        cfuture.add_done_callback(lambda done: self._finished(loop, result, done))
        # A bare timer rather than wait_for: one heap entry, no extra task or future.
        timer = None
        if deadline is not None:
            timer = loop.call_at(deadline, self._expire, result, cfuture, submitted)
        try:
            return await result
        except asyncio.CancelledError:
            cfuture.cancel()  # a run that has not started never will
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _finished(
        self,
        loop: asyncio.AbstractEventLoop,
        result: asyncio.Future[RunResult],
        done: Future[RunResult],
    ) -> None:
        """On the lane thread (or wherever the future was cancelled): settle on the loop."""
        if done.cancelled():
            with self._lock:
                self._queued -= 1
            # Cancelled by its caller (client gone, deadline: already answered) or by
            # close() while still queued: then its caller must hear why, not wait forever.
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(_settle_unloaded, result)
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(_settle, result, done)

    @staticmethod
    def _expire(
        result: asyncio.Future[RunResult], cfuture: Future[RunResult], submitted: float
    ) -> None:
        if result.done():
            return
        cfuture.cancel()
        result.set_exception(DeadlineExceededError.queued_or_running(time.monotonic() - submitted))

    def _run(
        self,
        parts: Sequence[Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        deadline: float | None,
        submitted: float,
    ) -> RunResult:
        start = time.monotonic()
        index = self._local.lane
        lane = self._lane_stats[index]
        with self._lock:
            self._queued -= 1
            if deadline is not None and start >= deadline:
                raise DeadlineExceededError.in_queue(start - submitted)
            lane.runs += 1
            self._running += 1
        try:
            outputs = self._execute(index, parts, output_names)
        except BaseException:
            with self._lock:
                lane.failed += 1
            raise
        finally:
            with self._lock:
                lane.busy_s += time.monotonic() - start
                self._running -= 1
        return RunResult(outputs, start - submitted, time.monotonic() - start)

    def run_blocking(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        """Warm-up: one run as lane 0, on the caller's thread, outside the counters."""
        self._lane_started()
        return self._execute(0, [inputs], output_names)

    def stats(self) -> ExecutorStats:
        """Per-lane runs and busy time, queued and running runs, the pools."""
        with self._lock:
            lanes = [LaneStats(s.runs, s.failed, s.busy_s) for s in self._lane_stats]
            queued, running = self._queued, self._running
        return ExecutorStats(self.kind, lanes, queued, running, self._pools())

    def _stop_lanes(self, wait: bool) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)


def _settle_unloaded(result: asyncio.Future[RunResult]) -> None:
    if not result.done():
        result.set_exception(
            UnavailableError("the model was unloaded before this request ran; retry")
        )


def _settle(result: asyncio.Future[RunResult], done: Future[RunResult]) -> None:
    """Copy a finished lane run into the awaited future, unless it was already answered."""
    if result.done():
        return
    error = done.exception()
    if error is not None:
        result.set_exception(error)
    else:
        result.set_result(done.result())
