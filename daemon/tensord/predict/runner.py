"""Runs a model's requests on worker threads, honouring each request's deadline.

A request that is still queued when its deadline passes never runs; one whose client
goes away is dropped from the queue. The event loop only awaits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tensord.backends.base import Backend
from tensord.errors import DeadlineExceededError


@dataclass(slots=True)
class RunnerStats:
    """Counters of one runner: runs that started, finished, failed."""

    started: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(slots=True)
class RunResult:
    """Outputs of one run and where its time went (seconds)."""

    outputs: list[np.ndarray]
    queue_s: float
    compute_s: float


def join_inputs(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One request's inputs as they are; several joined along dimension 0."""
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


class ModelRunner:
    """`instance_count` concurrent runs of one backend, on a thread pool of that size."""

    def __init__(self, name: str, backend: Backend, instances: int) -> None:
        self._backend = backend
        self.stats = RunnerStats()
        self._stats_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"model-{name}")

    async def run(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        deadline: float | None,
    ) -> RunResult:
        """Queue one run; `deadline` is a time.monotonic() value or None."""
        submitted = time.monotonic()
        future = asyncio.wrap_future(
            self._pool.submit(self._run, inputs, output_names, deadline, submitted)
        )
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

    def _run(
        self,
        inputs: Mapping[str, np.ndarray] | list[dict[str, np.ndarray]],
        output_names: Sequence[str],
        deadline: float | None,
        submitted: float,
    ) -> RunResult:
        start = time.monotonic()
        if isinstance(inputs, list):
            inputs = join_inputs(inputs)
        if deadline is not None and start >= deadline:
            raise DeadlineExceededError(
                f"the deadline passed after {(start - submitted) * 1e3:.1f} ms in the queue; "
                "the request did not run"
            )
        with self._stats_lock:
            self.stats.started += 1
        try:
            outputs = self._backend.run(inputs, output_names)
        except BaseException:
            with self._stats_lock:
                self.stats.failed += 1
            raise
        with self._stats_lock:
            self.stats.completed += 1
        return RunResult(outputs, start - submitted, time.monotonic() - start)

    async def run_joined(
        self, parts: list[dict[str, np.ndarray]], output_names: Sequence[str]
    ) -> tuple[list[np.ndarray], float]:
        """Join requests along dimension 0 and run them once (the batcher's runner)."""
        result = await asyncio.wrap_future(
            self._pool.submit(self._run, parts, output_names, None, time.monotonic())
        )
        return result.outputs, result.compute_s

    def run_blocking(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        """A direct run on the caller's thread (warm-up)."""
        return self._backend.run(inputs, output_names)

    def close(self) -> None:
        """Stop the workers once queued runs finish; they are not waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)
