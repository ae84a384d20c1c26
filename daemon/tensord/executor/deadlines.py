"""The deadline queue's entries and waiting, shared by the lanes and the dynamic batcher.

A queued request carries when it arrived, its deadline (a time.monotonic() value, or None)
and the future its caller awaits. While the caller waits (`Queued.wait_in_queue`), a bare
timer on the event loop fails it DEADLINE_EXCEEDED at its deadline, whether it is still
queued or already running; whoever takes it off the queue checks the deadline once more
(`Queued.expired_in_queue`), so a request whose deadline passed while it waited never runs;
and when the caller stops waiting (answered, expired, or cancelled because its client went
away) the queue is told, so a request nobody waits for never runs and holds no place.

The queues themselves differ in what they hold and who takes from them (the batcher's
deque is read on the event loop, the lanes' queue by worker threads): each keeps its
container and calls these.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

from tensord.errors import DeadlineExceededError

T = TypeVar("T")


@dataclass(slots=True, eq=False)  # eq=False: a queued request is itself, not its fields
class Queued(Generic[T]):
    """One queued request: when it arrived, its deadline, the future its caller awaits."""

    arrived: float
    deadline: float | None
    future: asyncio.Future[T]

    def expired_in_queue(self, now: float) -> DeadlineExceededError | None:
        """The error for this request taken off its queue at `now`; None while it has time."""
        if self.deadline is not None and now >= self.deadline:
            return DeadlineExceededError.in_queue(now - self.arrived)
        return None

    async def wait_in_queue(
        self, on_expired: Callable[[Self], object], on_left: Callable[[Self], object]
    ) -> T:
        """Await the future. At the deadline `on_expired(self)` runs, then the future fails
        DEADLINE_EXCEEDED (unless already answered); once the caller stops waiting, for
        whatever reason, `on_left(self)` runs (it takes a request not yet started off the
        queue). A bare timer rather than wait_for: one heap entry, no extra task or future."""
        timer = None
        if self.deadline is not None:
            loop = asyncio.get_running_loop()
            timer = loop.call_at(self.deadline, self._expire, on_expired)
        try:
            return await self.future
        finally:
            on_left(self)
            if timer is not None:
                timer.cancel()

    def _expire(self, on_expired: Callable[[Self], object]) -> None:
        if self.future.done():
            return
        on_expired(self)
        self.future.set_exception(
            DeadlineExceededError.queued_or_running(time.monotonic() - self.arrived)
        )
