"""Requests running on one model version, so that it is freed only after they finish."""

from __future__ import annotations

import asyncio
from types import TracebackType


class InflightCounter:
    """`with counter:` around a request's run; `await counter.wait_idle()` to drain.

    Used from the event loop only (the data plane enters it before its first await, so a
    version swapped out of the registry cannot gain a request after the swap).
    """

    __slots__ = ("_count", "_idle")

    def __init__(self) -> None:
        self._count = 0
        self._idle: asyncio.Event | None = None

    @property
    def count(self) -> int:
        """Requests running now."""
        return self._count

    def __enter__(self) -> InflightCounter:
        self._count += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._count -= 1
        if self._count == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no request runs."""
        while self._count:
            self._idle = asyncio.Event()
            await self._idle.wait()
        self._idle = None
