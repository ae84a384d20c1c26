"""The dynamic batcher: one queue per model version, batches formed as instances free up.

Requests whose non-batch dimensions (and asked-for outputs) agree are joined along
dimension 0, up to max_batch_size. Each kind of request (its key) forms its own batch,
with one monotonic deadline: the arrival of the request that opened it plus
max_queue_delay, kept when that request leaves. A full batch, or one that reaches a
preferred size (the largest it can), dispatches at once, whatever another kind waits for.
A request whose deadline passes in the queue, or whose client goes away, never runs and
stops counting against max_queue_size (the deadline queue's entries, executor/deadlines.py,
which the lanes use too).

With a token budget (a text encoder's runs), requests of any length along dimension 1 join:
a batch starts from the oldest request and takes the queued ones closest to its length, as
long as rows x the longest length stays within the budget, and the batch is padded to its
longest request (each input with its pad value) before it runs. Packing by length keeps the
padding, and so the work wasted on it, small.
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

from tensord.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from tensord.executor.base import RunResult
from tensord.executor.deadlines import Queued

log = structlog.get_logger("tensord.batching")

PAD_SLACK = 0.05
PAD_ALLOWANCE = 32
"""With a token budget, a request joins a batch only while its padding stays within this
share of its tokens plus this many: texts of very different lengths run apart."""

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
    max_batch_tokens: int = 0
    """With a budget, requests of different lengths along dimension 1 join, padded (rows x
    the longest length at most this); 0: only requests of equal shapes join."""
    pad_values: tuple[tuple[str, int], ...] = ()
    """What padding fills each input with (by name; 0 for any other)."""


@dataclass(slots=True, eq=False)
class Pending(Queued[RunResult]):
    """One queued request."""

    inputs: dict[str, np.ndarray]
    output_names: tuple[str, ...]
    key: tuple[object, ...]
    size: int
    length: int = 0
    """Its length along dimension 1, when batches pack by tokens."""


@dataclass(slots=True)
class BatcherStats:
    """What the batcher has done: batches, requests, and their sizes."""

    batches: int = 0
    requests: int = 0
    rows: int = 0
    expired: int = 0
    rejected: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)


def batch_key(
    inputs: dict[str, np.ndarray], output_names: Sequence[str], padded: bool = False
) -> tuple[object, ...]:
    """Requests with equal keys can be joined: same names, dtypes, non-batch dims (but the
    length along dimension 1 when batches are `padded`), outputs."""
    first = 2 if padded else 1
    if len(inputs) == 1:  # the common case, without the sort
        ((name, a),) = inputs.items()
        return (((name, a.dtype.str, a.shape[first:]),), tuple(output_names))
    parts = tuple((name, a.dtype.str, a.shape[first:]) for name, a in sorted(inputs.items()))
    return (parts, tuple(output_names))


def pad_to(
    parts: Sequence[dict[str, np.ndarray]], pad_values: dict[str, int]
) -> list[dict[str, np.ndarray]]:
    """The parts with every input padded along dimension 1 to the longest part's length."""
    longest = max(next(iter(p.values())).shape[1] for p in parts)
    padded = []
    for part in parts:
        if next(iter(part.values())).shape[1] == longest:
            padded.append(part)
            continue
        grown = {}
        for name, a in part.items():
            out = np.full((a.shape[0], longest, *a.shape[2:]), pad_values.get(name, 0), a.dtype)
            out[:, : a.shape[1]] = a
            grown[name] = out
        padded.append(grown)
    return padded


class DynamicBatcher:
    """Queues requests for one model version and runs them in batches, one per free instance."""

    def __init__(self, name: str, settings: BatchingSettings, run_batch: BatchRunner) -> None:
        self.name = name
        self.settings = settings
        self.stats = BatcherStats()
        self._run_batch = run_batch
        self._preferred = frozenset(settings.preferred_batch_size)
        self._tokens = settings.max_batch_tokens
        self._pads = dict(settings.pad_values)
        self._queue: deque[Pending] = deque()
        self._opened: dict[tuple[object, ...], float] = {}
        """Per key with requests queued: when its forming batch opened (its deadline is
        that plus the delay)."""
        self._arrival = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.instances)
        self._in_flight: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def queue_depth(self) -> int:
        """Requests waiting (not counting those cancelled or expired in the queue)."""
        return sum(1 for pending in self._queue if not pending.future.done())

    def _has_room(self, requests: int) -> bool:
        """Whether `requests` more fit within max_queue_size (cancelled and expired
        requests hold no place)."""
        limit = self.settings.max_queue_size
        if not limit or len(self._queue) + requests <= limit:
            return True
        self._drop_dead()
        return len(self._queue) + requests <= limit

    def check_room(self, requests: int) -> None:
        """Before `requests` requests of one call are submitted: INVALID_ARGUMENT when
        they exceed max_queue_size (they could never wait together), RESOURCE_EXHAUSTED
        when the queue has no room for all of them now (none is queued)."""
        limit = self.settings.max_queue_size
        if limit and requests > limit:
            raise InvalidArgumentError(
                f"the request has {requests} inputs, more than model {self.name!r}'s queue "
                f"holds (max_queue_size {limit}); send fewer a request"
            )
        if not self._has_room(requests):
            self.stats.rejected += 1
            raise ResourceExhaustedError(
                f"the queue of model {self.name!r} has no room for {requests} more inputs "
                f"({len(self._queue)} of {limit} waiting); retry later, or raise max_queue_size"
            )

    async def submit(
        self, inputs: dict[str, np.ndarray], output_names: Sequence[str], deadline: float | None
    ) -> RunResult:
        """Queue a request and wait for its share of a batch."""
        if self._closed:
            raise UnavailableError(f"model {self.name!r} is unloading")
        if not self._has_room(1):
            self.stats.rejected += 1
            limit = self.settings.max_queue_size
            raise ResourceExhaustedError(
                f"the queue of model {self.name!r} is full ({limit} requests waiting); retry "
                "later, or raise max_queue_size in its model.toml"
            )
        now = time.monotonic()
        if deadline is None and self.settings.default_timeout_s:
            deadline = now + self.settings.default_timeout_s
        first = next(iter(inputs.values())) if inputs else None
        size = first.shape[0] if first is not None else 0
        length = first.shape[1] if self._tokens and first is not None and first.ndim > 1 else 0
        if length * max(size, 1) > self._tokens > 0:
            raise ResourceExhaustedError(
                f"a request of {size} x {length} tokens exceeds model {self.name!r}'s "
                f"max_batch_tokens {self._tokens}"
            )
        loop = asyncio.get_running_loop()
        key = batch_key(inputs, output_names, padded=bool(self._tokens))
        pending = Pending(
            now, deadline, loop.create_future(), inputs, tuple(output_names), key, size, length
        )
        self._queue.append(pending)
        self._opened.setdefault(pending.key, now)
        self._arrival.set()
        self._ensure_loop()
        return await pending.wait_in_queue(self._expired, self._left)

    def _expired(self, pending: Pending) -> None:
        self.stats.expired += 1

    def _left(self, pending: Pending) -> None:
        # gRPC ended the call at its deadline before our timer did (cancelling the task
        # cancels the future it awaits): an expired request all the same.
        future = pending.future
        unanswered = future.cancelled() or not future.done()
        if unanswered and pending.deadline is not None and time.monotonic() >= pending.deadline:
            self.stats.expired += 1
        # A request that is still queued is skipped when the next batch forms.
        future.cancel()

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
        """Wait until a forming batch is ready (full, at a preferred size, or due), then
        take it out of the queue; of several ready, the one opened first goes first."""
        delay = self.settings.max_queue_delay_s
        while True:
            self._drop_dead()
            groups: dict[tuple[object, ...], list[Pending]] = {}
            for pending in self._queue:
                groups.setdefault(pending.key, []).append(pending)
            for key in [k for k in self._opened if k not in groups]:
                del self._opened[key]  # every request of that kind left
            now = time.monotonic()
            wake: float | None = None
            for key, members in sorted(groups.items(), key=lambda kv: self._opened[kv[0]]):
                batch, ready = self._cut(members)
                due = self._opened[key] + delay
                if ready or now >= due:
                    self._take(key, batch)
                    return batch
                wake = due if wake is None else min(wake, due)
            self._arrival.clear()
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), timeout)

    def _cut(self, members: list[Pending]) -> tuple[list[Pending], bool]:
        """One kind's batch, oldest first, and whether it is ready now: full (the next
        request would not fit, or max_batch_size is reached), or at the largest preferred
        size its queued requests make."""
        if self._tokens:
            return self._cut_by_tokens(members)
        limit = self.settings.max_batch_size
        batch: list[Pending] = []
        size = preferred = 0
        for pending in members:
            if batch and size + pending.size > limit:
                return batch, True
            batch.append(pending)
            size += pending.size
            if size in self._preferred:
                preferred = len(batch)
            if size >= limit:
                return batch, True
        if preferred:
            return batch[:preferred], True
        return batch, False

    def _cut_by_tokens(self, members: list[Pending]) -> tuple[list[Pending], bool]:
        """The oldest request and those closest to its length, while rows stay within
        max_batch_size, rows x the longest length within max_batch_tokens, and the padding
        within PAD_SLACK of the tokens (work spent on padding is lost, and attention's grows
        with the square of the length); ready when another queued request would not fit."""
        oldest = members[0]
        rows_limit, budget = self.settings.max_batch_size, self._tokens
        batch = [oldest]
        rows, longest, tokens = oldest.size, oldest.length, oldest.size * oldest.length
        # The next oldest few are the candidates: a queue of thousands of texts is not
        # sorted whole for every run.
        window = members[1 : 1 + 4 * rows_limit]
        others = sorted(window, key=lambda p: abs(p.length - oldest.length))
        for pending in others:
            grown = max(longest, pending.length)
            padded = (rows + pending.size) * grown
            real = tokens + pending.size * pending.length
            if (
                rows + pending.size > rows_limit
                or padded > budget
                or padded > real * (1 + PAD_SLACK) + PAD_ALLOWANCE
            ):
                return batch, True
            batch.append(pending)
            rows, longest, tokens = rows + pending.size, grown, real
        return batch, rows >= rows_limit or rows * longest >= budget

    def _take(self, key: tuple[object, ...], batch: list[Pending]) -> None:
        """Remove a formed batch from the queue in one pass (not a deque.remove per member:
        O(queue x batch), milliseconds on the event loop under overload). What is left of
        its kind opens a new batch at the arrival of its oldest request."""
        taken = {id(pending) for pending in batch}
        self._queue = deque(p for p in self._queue if id(p) not in taken)
        left = [p.arrived for p in self._queue if p.key == key]
        if left:
            self._opened[key] = min(left)
        else:
            del self._opened[key]

    def _drop_dead(self) -> None:
        """Remove cancelled requests and fail expired ones, so neither ever runs."""
        now = time.monotonic()
        live: deque[Pending] = deque()
        for pending in self._queue:
            if pending.future.done():
                continue
            expired = pending.expired_in_queue(now)
            if expired is not None:
                self.stats.expired += 1
                pending.future.set_exception(expired)
                continue
            live.append(pending)
        self._queue = live

    async def _dispatch(self, batch: list[Pending]) -> None:
        start = time.monotonic()
        try:
            live = [p for p in batch if not p.future.done()]
            if not live:
                return
            parts = [p.inputs for p in live]
            if self._tokens:
                parts = pad_to(parts, self._pads)
            result = await self._run_batch(parts, live[0].output_names)
            served = []
            offset = 0
            for pending in live:
                if not pending.future.done():
                    share = [out[offset : offset + pending.size] for out in result.outputs]
                    queue_s = start - pending.arrived + result.queue_s
                    pending.future.set_result(RunResult(share, queue_s, result.compute_s))
                    served.append(pending)
                offset += pending.size
            self._record(live, served)
        except Exception as exc:
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
        finally:
            self._slots.release()

    def _record(self, ran: list[Pending], served: list[Pending]) -> None:
        """A batch of `ran` ran; `served` are those still waiting for it when it ended (a
        request whose deadline passed while it ran counts as expired, not served)."""
        rows = sum(p.size for p in ran)
        stats = self.stats
        stats.batches += 1
        stats.batch_sizes[rows] = stats.batch_sizes.get(rows, 0) + 1
        stats.requests += len(served)
        stats.rows += sum(p.size for p in served)

    async def close(self) -> None:
        """Stop forming batches; queued requests fail UNAVAILABLE, running ones finish."""
        self._closed = True
        if self._loop_task is not None:
            self._loop_task.cancel()
        for pending in self._queue:
            if not pending.future.done():
                pending.future.set_exception(UnavailableError(f"model {self.name!r} is unloading"))
        self._queue.clear()
        self._opened.clear()
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
