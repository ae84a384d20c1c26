"""Server reflection whose streams end when the server drains.

A reflection stream stays open for as long as its client keeps it, waiting for the next
request; a server that stops with a grace period would wait the whole grace for it. Here
each wait for the next request races the drain: once `close()` is called (the drain's
start), a stream still open ends with UNAVAILABLE, and new ones are refused the same way,
so the drain waits only for real work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

SERVICE_NAME = reflection.SERVICE_NAME
DRAINING = "the server is draining; reflect on another instance"


class ReflectionServicer(reflection.aio.ReflectionServicer):
    """grpc_reflection's asyncio servicer, plus close() for the drain."""

    def __init__(self, service_names: tuple[str, ...]) -> None:
        super().__init__(service_names)
        self.service_names = service_names
        """Every gRPC service the server offers (Info lists them as its endpoints)."""
        self._closing = asyncio.Event()

    async def ServerReflectionInfo(
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        """Answer each request as grpc_reflection does, until the client ends the stream
        or the drain begins (then UNAVAILABLE)."""
        replies = super().ServerReflectionInfo(self._requests(context), context)
        async for reply in replies:
            yield reply

    async def _requests(
        self, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        """The stream's requests, each read raced against the drain."""
        while True:
            if self._closing.is_set():
                await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
            read = asyncio.ensure_future(context.read())
            closing = asyncio.ensure_future(self._closing.wait())
            try:
                await asyncio.wait((read, closing), return_when=asyncio.FIRST_COMPLETED)
            finally:
                closing.cancel()
                if not read.done():
                    # Left to gRPC, which ends it with the call: cancelling a read in
                    # progress leaves the call unable to send its status.
                    read.add_done_callback(_consume)
            if not read.done():
                await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
            request = read.result()
            if request is grpc.aio.EOF:
                return
            yield request

    def close(self) -> None:
        """End every reflection stream, open or yet to come (at the drain's start)."""
        self._closing.set()


def add_reflection_servicer(servicer: ReflectionServicer, server: grpc.aio.Server) -> None:
    """Register server reflection (grpc.reflection.v1alpha) on `server`."""
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)


def _consume(read: asyncio.Future[Any]) -> None:
    """Retrieve a left read's outcome, so that asyncio does not log it as never retrieved."""
    if not read.cancelled():
        read.exception()
