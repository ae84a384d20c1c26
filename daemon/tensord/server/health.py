"""grpc.health.v1 with a drain that does not wait on Watch streams.

A Watch stream never ends by itself, so a server that stops with a grace period would
hold every open one for the whole grace. Here, once the drain has told watchers
NOT_SERVING and the server stops taking calls, their streams end (OK), and the drain
waits only for real work.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from grpc_health.v1 import health, health_pb2


class HealthServicer(health.aio.HealthServicer):
    """grpc_health's asyncio servicer, plus close_watches() for the drain."""

    def __init__(self) -> None:
        super().__init__()
        self._closing = asyncio.Event()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        """Stream the service's status until the client leaves or the drain closes it."""
        watch = asyncio.ensure_future(super().Watch(request, context))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({watch, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not watch.done():
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        if not watch.cancelled():
            watch.result()  # an error of the stream itself

    def close_watches(self) -> None:
        """End every Watch stream, open or yet to come (at the drain, after NOT_SERVING)."""
        self._closing.set()
