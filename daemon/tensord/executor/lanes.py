"""What every executor shares: worker threads as lanes, a queue with deadlines, counters.

A request still queued when its deadline passes never runs; one whose client goes away is
dropped from the queue. The event loop only awaits. Subclasses say how one batch runs on
one lane (`_execute`) and which buffer pools they keep.

A short run that arrives after the executor has been quiet for a while (no run queued,
running, submitted or finished in the last `QUIET_S`) may run inline on the event loop's
thread (`inline_below_s`): handing it to a lane costs two thread wake-ups, which on a VM
take longer than a sub-millisecond model. Under load calls arrive closer together than
that, so they always go to the lanes and the loop stays free to take the next request
(without the quiet period an inline run would keep the lanes idle and so invite the next
inline run: one thread serving everything). The estimate that gates it is conservative
(seconds per row, times the rows), so the loop is held for about that long at most.
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

QUIET_S = 250e-6
"""How long an executor must have been idle for a call to run inline (see above)."""


class LaneExecutor:
    """`lanes` worker threads; lane i's thread always runs on lane i's resources."""

    kind = "lanes"

    def __init__(self, name: str, lanes: int, reason: str, inline_below_s: float = 0.0) -> None:
        self.reason = reason
        self.inline_below_s = inline_below_s
        """Run inline on the loop when idle and the estimate is below this; 0 never."""
        self._row_s = float("inf")  # recent compute seconds per row (moving average)
        self._last_activity = 0.0  # time.monotonic() of the last submission or finish
        self.inline_runs = 0
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
        quiet = submitted - self._last_activity >= QUIET_S
        self._last_activity = submitted
        if quiet and self._may_run_inline(parts):
            return self._run_inline(parts, output_names, deadline, submitted)
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
            return
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
        outputs = self._execute_counted(index, lane, parts, output_names, start)
        return RunResult(outputs, start - submitted, time.monotonic() - start)

    def _execute_counted(
        self,
        index: int,
        lane: LaneStats,
        parts: Sequence[Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        start: float,
    ) -> list[np.ndarray]:
        """`_execute` with the lane's counters and the per-row time estimate kept."""
        try:
            outputs = self._execute(index, parts, output_names)
        except BaseException:
            with self._lock:
                lane.failed += 1
            raise
        finally:
            self._last_activity = end = time.monotonic()
            elapsed = end - start
            with self._lock:
                lane.busy_s += elapsed
                self._running -= 1
        self._observe(parts, elapsed)
        return outputs

    def _observe(self, parts: Sequence[Mapping[str, np.ndarray]], elapsed: float) -> None:
        per_row = elapsed / max(1, _rows(parts))
        self._row_s = per_row if self._row_s == float("inf") else 0.8 * self._row_s + 0.2 * per_row

    def _may_run_inline(self, parts: Sequence[Mapping[str, np.ndarray]]) -> bool:
        # Unlocked reads: a stale value only picks the other (equally correct) path.
        return (
            self._queued == 0
            and self._running == 0
            and self._row_s * max(1, _rows(parts)) < self.inline_below_s
        )

    def _run_inline(
        self,
        parts: Sequence[Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        deadline: float | None,
        submitted: float,
    ) -> RunResult:
        """Run on the caller's (the event loop's) thread, counted as lane 0."""
        start = time.monotonic()
        lane = self._lane_stats[0]
        with self._lock:
            lane.runs += 1
            self._running += 1
            self.inline_runs += 1
        outputs = self._execute_counted(0, lane, parts, output_names, start)
        end = time.monotonic()
        if deadline is not None and end >= deadline:
            raise DeadlineExceededError.queued_or_running(end - submitted)
        return RunResult(outputs, start - submitted, end - start)

    def run_blocking(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        """Warm-up: one run as lane 0, on the caller's thread, outside the counters."""
        self._lane_started()
        start = time.monotonic()
        outputs = self._execute(0, [inputs], output_names)
        self._observe([inputs], time.monotonic() - start)
        return outputs

    def stats(self) -> ExecutorStats:
        """Per-lane runs and busy time, queued and running runs, the pools."""
        with self._lock:
            lanes = [LaneStats(s.runs, s.failed, s.busy_s) for s in self._lane_stats]
            queued, running = self._queued, self._running
        return ExecutorStats(self.kind, lanes, queued, running, self._pools())

    def _stop_lanes(self, wait: bool) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)


def _rows(parts: Sequence[Mapping[str, np.ndarray]]) -> int:
    """Rows along dimension 0 across the parts (1 for scalars)."""
    total = 0
    for part in parts:
        first = next(iter(part.values()), None)
        total += first.shape[0] if first is not None and first.ndim else 1
    return total


def _settle(result: asyncio.Future[RunResult], done: Future[RunResult]) -> None:
    """Copy a finished lane run into the awaited future, unless it was already answered."""
    if result.done():
        return
    error = done.exception()
    if error is not None:
        result.set_exception(error)
    else:
        result.set_result(done.result())
