"""The CPU executor: worker threads as lanes, joins into pooled aligned host buffers.

A request still queued when its deadline passes never runs; one whose client goes away
is dropped from the queue. The event loop only awaits.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import numpy as np

from tensord.backends.base import Backend
from tensord.errors import DeadlineExceededError
from tensord.executor.base import ExecutorStats, LaneStats, RunResult
from tensord.executor.pools import HostBufferPool


def join_into(
    parts: Sequence[Mapping[str, np.ndarray]], take: Callable[[int], np.ndarray]
) -> dict[str, np.ndarray]:
    """One request's inputs as they are; several joined along dimension 0 into buffers
    from `take(nbytes)` (object arrays, which hold Python strings, are joined normally)."""
    if len(parts) == 1:
        return dict(parts[0])
    joined = {}
    for name, first in parts[0].items():
        arrays = [p[name] for p in parts]
        if first.dtype == object:
            joined[name] = np.concatenate(arrays)
            continue
        shape = (sum(a.shape[0] for a in arrays), *first.shape[1:])
        nbytes = int(np.prod(shape, dtype=np.int64)) * first.dtype.itemsize
        out = take(nbytes)[:nbytes].view(first.dtype).reshape(shape)
        np.concatenate(arrays, out=out)
        joined[name] = out
    return joined


class CpuExecutor:
    """`lanes` worker threads running one backend (ONNX Runtime sessions are thread-safe)."""

    kind = "cpu"

    def __init__(self, name: str, backend: Backend, lanes: int, reason: str = "") -> None:
        self.reason = reason
        self._backend = backend
        self._lane_ids = itertools.count()
        self._local = threading.local()
        self._lanes = [LaneStats() for _ in range(lanes)]
        self._lock = threading.Lock()
        self._queued = 0
        self._running = 0
        self._host = HostBufferPool()
        self._pool = ThreadPoolExecutor(
            max_workers=lanes, thread_name_prefix=f"lane-{name}", initializer=self._name_lane
        )

    def _name_lane(self) -> None:
        self._local.lane = next(self._lane_ids)

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

    def _dequeued_if_cancelled(self, cfuture: object) -> None:
        if getattr(cfuture, "cancelled", lambda: False)():
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
        lane = self._lanes[self._local.lane]
        with self._lock:
            self._queued -= 1
        if deadline is not None and start >= deadline:
            raise DeadlineExceededError(
                f"the deadline passed after {(start - submitted) * 1e3:.1f} ms in the queue; "
                "the request did not run"
            )
        with self._lock:
            lane.runs += 1
            self._running += 1
        with ExitStack() as buffers:

            def take(nbytes: int) -> np.ndarray:
                buffer = self._host.acquire(nbytes)
                buffers.callback(self._host.release, buffer)
                return buffer

            try:
                outputs = self._backend.run(join_into(parts, take), output_names)
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
        """A direct run on the caller's thread (warm-up)."""
        return self._backend.run(inputs, output_names)

    def stats(self) -> ExecutorStats:
        """Per-lane runs and busy time, queued runs, the host pool."""
        with self._lock:
            lanes = [LaneStats(s.runs, s.failed, s.busy_s) for s in self._lanes]
            queued, running = self._queued, self._running
        return ExecutorStats(self.kind, lanes, queued, running, {"host": self._host.stats()})

    def close(self) -> None:
        """Stop the lanes, drop cached buffers and close the backend.

        Queued runs are cancelled; a run in progress finishes on its thread, holding its own
        reference to the session.
        """
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._host.clear()
        self._backend.close()
