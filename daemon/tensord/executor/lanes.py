"""What every executor shares: worker threads as lanes, a queue with deadlines, counters.

A request still queued when its deadline passes never runs; one whose client goes away is
dropped from the queue. The event loop only awaits. Subclasses say how one batch runs on
one lane (`_execute`) and which buffer pools they keep.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from tensord.errors import DeadlineExceededError
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
        with self._lock:
            self._queued += 1
        cfuture = self._pool.submit(self._run, parts, output_names, deadline, submitted)
        cfuture.add_done_callback(self._dequeued_if_cancelled)
        future = asyncio.wrap_future(cfuture)
        if deadline is None:
            return await future
        try:
            # On timeout wait_for cancels the future, which drops it if it has not started.
            return await asyncio.wait_for(future, timeout=max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            waited = (time.monotonic() - submitted) * 1e3
            raise DeadlineExceededError(
                f"the deadline passed after {waited:.1f} ms while the request was queued or running"
            ) from None

    def _dequeued_if_cancelled(self, cfuture: Future[RunResult]) -> None:
        if cfuture.cancelled():
            with self._lock:
                self._queued -= 1

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
                raise DeadlineExceededError(
                    f"the deadline passed after {(start - submitted) * 1e3:.1f} ms in the queue; "
                    "the request did not run"
                )
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
