"""What every executor shares: worker threads as lanes, a queue with deadlines, counters.

A request still queued when its deadline passes never runs; one whose client goes away is
dropped from the queue (the deadline queue's entries, executor/deadlines.py, which the
dynamic batcher uses too). The event loop only awaits. Subclasses say how one batch runs on
one lane (`_execute`) and which buffer pools they keep.

The lanes are plain threads on one `queue.SimpleQueue`, and a run hands its result to the
event loop with one `call_soon_threadsafe`, straight into the future the caller awaits: no
concurrent.futures.Future (a Condition and its lock per run) and no ThreadPoolExecutor
bookkeeping. A loop-to-lane-and-back hop costs ~18 us of CPU this way against ~52 us
through `run_in_executor` (measured on the 2-core benchmark host).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tensord.cuda.pools import PoolStats
from tensord.errors import UnavailableError
from tensord.executor.base import ExecutorStats, LaneStats, RunResult
from tensord.executor.deadlines import Queued

_QUEUED, _STARTED, _DROPPED = 0, 1, 2


@dataclass(slots=True, eq=False)
class _Run(Queued[RunResult]):
    """One queued run; `state` changes under the executor's lock."""

    parts: Sequence[Mapping[str, np.ndarray]]
    output_names: Sequence[str]
    loop: asyncio.AbstractEventLoop
    state: int = _QUEUED

    def settle(self, result: RunResult | None, error: BaseException | None) -> None:
        """From any thread: answer the awaited future on its loop (unless already answered)."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            self.loop.call_soon_threadsafe(_settle, self.future, result, error)


def _settle(
    future: asyncio.Future[RunResult], result: RunResult | None, error: BaseException | None
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


# Lane threads are not daemons (a run in progress at exit finishes: ONNX Runtime must not be
# torn down under it), so an executor nobody closed must still let the interpreter exit:
# like concurrent.futures, wake every idle lane when the interpreter starts shutting down.
_LIVE: weakref.WeakSet[LaneExecutor] = weakref.WeakSet()


def _wake_all_at_exit() -> None:
    for executor in list(_LIVE):
        executor._stop_lanes(wait=False)


threading._register_atexit(_wake_all_at_exit)  # type: ignore[attr-defined]


class LaneExecutor:
    """`lanes` worker threads; lane i's thread always runs on lane i's resources."""

    kind = "lanes"

    def __init__(self, name: str, lanes: int, reason: str) -> None:
        self.reason = reason
        self._lane_stats = [LaneStats() for _ in range(lanes)]
        self._lock = threading.Lock()
        self._queued = 0
        self._running = 0
        self._stopped = False
        self._work: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._lane_main, args=(i,), name=f"{self.kind}-{name}_{i}")
            for i in range(lanes)
        ]
        for thread in self._threads:
            thread.start()
        _LIVE.add(self)

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
        loop = asyncio.get_running_loop()
        run = _Run(time.monotonic(), deadline, loop.create_future(), parts, output_names, loop)
        with self._lock:
            if self._stopped:
                raise _unloaded()
            self._queued += 1
        self._work.put(run)
        # A run that has not started when its caller stops waiting never will.
        return await run.wait_in_queue(self._drop, self._drop)

    def _drop(self, run: _Run) -> bool:
        """Take a run that has not started out of the count; False if it already started."""
        with self._lock:
            if run.state != _QUEUED:
                return run.state == _DROPPED
            run.state = _DROPPED
            self._queued -= 1
            return True

    def _lane_main(self, index: int) -> None:
        try:
            self._lane_started()
        except BaseException as exc:  # every run this lane takes fails with why
            failed: BaseException | None = exc
        else:
            failed = None
        while True:
            run = self._work.get()
            if run is None:
                return
            self._run(index, run, failed)

    def _run(self, index: int, run: _Run, failed: BaseException | None) -> None:
        start = time.monotonic()
        lane = self._lane_stats[index]
        with self._lock:
            if run.state != _QUEUED:
                return  # its caller went away, or its deadline passed in the queue
            self._queued -= 1
            if self._stopped:  # taken off the queue after close(): never runs
                run.state = _DROPPED
                run.settle(None, _unloaded())
                return
            run.state = _STARTED
            expired = run.expired_in_queue(start)
            if expired is not None:
                run.settle(None, expired)
                return
            lane.runs += 1
            self._running += 1
        error: BaseException | None = None
        try:
            if failed is not None:
                raise failed
            outputs = self._execute(index, run.parts, run.output_names)
        except BaseException as exc:
            error, outputs = exc, []
        end = time.monotonic()
        with self._lock:
            lane.busy_s += end - start
            self._running -= 1
            if error is not None:
                lane.failed += 1
            idle = not self._running and not self._queued
        if error is not None:
            run.settle(None, error)
        else:
            run.settle(RunResult(outputs, start - run.arrived, end - start), None)
        if idle:
            self._idle()

    def _idle(self) -> None:
        """Called on a lane's thread when the last run in progress ended and none waits:
        the moment to free pooled buffers beyond their cap."""

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
        """Queued runs end UNAVAILABLE; runs in progress finish; the lanes exit after them."""
        with self._lock:
            first = not self._stopped
            self._stopped = True
        if first:
            while True:
                try:
                    run = self._work.get_nowait()
                except queue.Empty:
                    break
                if run is not None and self._drop(run):
                    run.settle(None, _unloaded())
            for _ in self._threads:
                self._work.put(None)
        if wait:
            current = threading.current_thread()
            for thread in self._threads:
                if thread is not current:
                    thread.join()


def _unloaded() -> UnavailableError:
    return UnavailableError("the model was unloaded before this request ran; retry")
