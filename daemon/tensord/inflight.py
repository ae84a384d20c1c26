"""Work running now, counted so that a drain or an unload waits until it has finished."""

from __future__ import annotations

import asyncio
from types import TracebackType


class InflightCounter:
    """`with counter:` around a piece of work; `await counter.wait_idle()` to drain.

    Used from the event loop only. The data plane enters a version's counter before its
    first await, so a version swapped out of the registry cannot gain a request after the
    swap; the RPC decorators count the handlers running, so the drain can wait for none.
    """

    __slots__ = ("_count", "_idle")

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        """Work running now."""
        return self._count

    def __enter__(self) -> InflightCounter:
        self._count += 1
        self._idle.clear()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._count -= 1
        if self._count == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Until nothing runs (bound the wait with asyncio.timeout)."""
        await self._idle.wait()
