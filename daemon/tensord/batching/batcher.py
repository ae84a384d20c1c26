"""The dynamic batcher: one queue per model version, batches formed as instances free up.

Requests whose non-batch dimensions (and asked-for outputs) agree are joined along
dimension 0, up to max_batch_size. Each forming batch has one monotonic deadline, the
arrival of its oldest request plus max_queue_delay; a preferred size dispatches at once.
A request whose deadline passes in the queue, or whose client goes away, never runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import structlog

from tensord.errors import DeadlineExceededError, ResourceExhaustedError, UnavailableError
from tensord.executor.base import RunResult

log = structlog.get_logger("tensord.batching")

# Joins the requests' inputs along dimension 0 and runs them once, off the event loop
# (an executor's `run`).
BatchRunner = Callable[[list[dict[str, np.ndarray]], Sequence[str]], Awaitable[RunResult]]


@dataclass(slots=True, frozen=True)
class BatchingSettings:
    """The per-model knobs, named as Triton names them."""

    max_batch_size: int
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    max_queue_size: int = 0
    """0 means unbounded."""
    default_timeout_s: float = 0.0
    """Deadline for requests that bring none; 0 means none."""
    instances: int = 1


@dataclass(slots=True, eq=False)
class Pending:
    """One queued request."""

    inputs: dict[str, np.ndarray]
    output_names: tuple[str, ...]
    key: tuple[object, ...]
    size: int
    arrived: float
    deadline: float | None
    future: asyncio.Future[RunResult]


@dataclass(slots=True)
class BatcherStats:
    """What the batcher has done: batches, requests, and their sizes."""

    batches: int = 0
    requests: int = 0
    rows: int = 0
    expired: int = 0
    rejected: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)


def batch_key(inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> tuple[object, ...]:
    """Requests with equal keys can be joined: same names, dtypes, non-batch dims, outputs."""
    parts = tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(inputs.items()))
    return (parts, tuple(output_names))


class DynamicBatcher:
    """Queues requests for one model version and runs them in batches, one per free instance."""

    def __init__(self, name: str, settings: BatchingSettings, run_batch: BatchRunner) -> None:
        self.name = name
        self.settings = settings
        self.stats = BatcherStats()
        self._run_batch = run_batch
        self._preferred = frozenset(settings.preferred_batch_size)
        self._queue: deque[Pending] = deque()
        self._arrival = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.instances)
        self._in_flight: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def queue_depth(self) -> int:
        """Requests waiting (cancelled ones may linger until the next batch forms)."""
        return len(self._queue)

    async def submit(
        self, inputs: dict[str, np.ndarray], output_names: Sequence[str], deadline: float | None
    ) -> RunResult:
        """Queue a request and wait for its share of a batch."""
        if self._closed:
            raise UnavailableError(f"model {self.name!r} is unloading")
        limit = self.settings.max_queue_size
        if limit and len(self._queue) >= limit:
            self.stats.rejected += 1
            raise ResourceExhaustedError(
                f"the queue of model {self.name!r} is full ({limit} requests waiting); retry "
                "later, or raise max_queue_size in its model.toml"
            )
        now = time.monotonic()
        if deadline is None and self.settings.default_timeout_s:
            deadline = now + self.settings.default_timeout_s
        size = next(iter(inputs.values())).shape[0] if inputs else 0
        pending = Pending(
            inputs,
            tuple(output_names),
            batch_key(inputs, output_names),
            size,
            now,
            deadline,
            asyncio.get_running_loop().create_future(),
        )
        self._queue.append(pending)
        self._arrival.set()
        self._ensure_loop()
        loop = asyncio.get_running_loop()
        timer = None if deadline is None else loop.call_at(deadline, self._expire, pending)
        try:
            return await pending.future
        finally:
            # A request that is still queued is skipped when the next batch forms.
            pending.future.cancel()
            if timer is not None:
                timer.cancel()

    def _expire(self, pending: Pending) -> None:
        if pending.future.done():
            return
        self.stats.expired += 1
        pending.future.set_exception(
            DeadlineExceededError.queued_or_running(time.monotonic() - pending.arrived)
        )

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._schedule())

    async def _schedule(self) -> None:
        """Form a batch whenever an instance is free; run it without waiting for it."""
        while not self._closed:
            await self._slots.acquire()
            try:
                batch = await self._form_batch()
            except BaseException:
                self._slots.release()
                raise
            task = asyncio.get_running_loop().create_task(self._dispatch(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _form_batch(self) -> list[Pending]:
        """Wait for a live request, then grow its batch until full, preferred, or due."""
        first = await self._next_live()
        close_at = first.arrived + self.settings.max_queue_delay_s
        while True:
            batch, size, full = self._compatible(first)
            if full or size in self._preferred or time.monotonic() >= close_at:
                break
            self._arrival.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), close_at - time.monotonic())
            if first.future.done():  # the oldest left: start over from the new head
                first = await self._next_live()
                close_at = first.arrived + self.settings.max_queue_delay_s
        # One pass, not a deque.remove per member: that is O(queue x batch) per batch,
        # which a long queue under overload turns into milliseconds on the event loop.
        taken = {id(pending) for pending in batch}
        self._queue = deque(p for p in self._queue if id(p) not in taken)
        return batch

    async def _next_live(self) -> Pending:
        while True:
            self._drop_dead()
            if self._queue:
                return self._queue[0]
            self._arrival.clear()
            await self._arrival.wait()

    def _drop_dead(self) -> None:
        """Remove cancelled requests and fail expired ones, so neither ever runs."""
        now = time.monotonic()
        live: deque[Pending] = deque()
        for pending in self._queue:
            if pending.future.done():
                continue
            if pending.deadline is not None and now >= pending.deadline:
                self.stats.expired += 1
                pending.future.set_exception(DeadlineExceededError.in_queue(now - pending.arrived))
                continue
            live.append(pending)
        self._queue = live

    def _compatible(self, first: Pending) -> tuple[list[Pending], int, bool]:
        """Queued requests joinable with `first`, oldest first, stopping at a preferred size."""
        limit = self.settings.max_batch_size
        batch: list[Pending] = []
        size = 0
        for pending in self._queue:
            if pending.future.done() or pending.key != first.key:
                continue
            if batch and size + pending.size > limit:
                return batch, size, True
            batch.append(pending)
            size += pending.size
            if size in self._preferred or size >= limit:
                return batch, size, size >= limit
        return batch, size, False

    async def _dispatch(self, batch: list[Pending]) -> None:
        start = time.monotonic()
        try:
            live = [p for p in batch if not p.future.done()]
            if not live:
                return
            result = await self._run_batch([p.inputs for p in live], live[0].output_names)
            self._record(live)
            offset = 0
            for pending in live:
                if not pending.future.done():
                    share = [out[offset : offset + pending.size] for out in result.outputs]
                    queue_s = start - pending.arrived + result.queue_s
                    pending.future.set_result(RunResult(share, queue_s, result.compute_s))
                offset += pending.size
        except Exception as exc:
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
        finally:
            self._slots.release()

    def _record(self, batch: list[Pending]) -> None:
        rows = sum(p.size for p in batch)
        stats = self.stats
        stats.batches += 1
        stats.requests += len(batch)
        stats.rows += rows
        stats.batch_sizes[rows] = stats.batch_sizes.get(rows, 0) + 1

    async def close(self) -> None:
        """Stop forming batches; queued requests fail UNAVAILABLE, running ones finish."""
        self._closed = True
        if self._loop_task is not None:
            self._loop_task.cancel()
        for pending in self._queue:
            if not pending.future.done():
                pending.future.set_exception(UnavailableError(f"model {self.name!r} is unloading"))
        self._queue.clear()
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
