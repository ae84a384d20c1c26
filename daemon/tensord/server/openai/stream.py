"""Server-sent events for a streamed completion, and a response that ends the stream (and
so aborts the sequence, freeing its KV blocks) as soon as the client disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tensord.dataplane import RequestOutput
from tensord.server.openai.responses import Shapes, event, usage

Ended = Callable[[BaseException | None], Awaitable[dict[str, Any] | None]]


async def events(
    first: RequestOutput,
    chunks: AsyncIterator[RequestOutput],
    shapes: Shapes,
    include_usage: bool,
    ended: Ended,
) -> AsyncIterator[bytes]:
    """`data: {chunk}` events, the usage chunk when asked for, then `data: [DONE]`. A
    failure mid-stream ends it with an `data: {"error": ...}` event (what was sent stays
    valid); `ended` runs once, however the stream ends."""
    last = first
    try:
        if shapes.chat:
            yield event(shapes.chunk(None, include_usage, first=True))
        yield event(shapes.chunk(first, include_usage))
        async for chunk in chunks:
            last = chunk
            yield event(shapes.chunk(chunk, include_usage))
    except Exception as exc:
        error = await ended(exc)
        if error is not None:
            yield event(error)
        return
    except BaseException as exc:  # cancelled, or closed: the client went away
        await ended(exc)
        raise
    if include_usage and last.usage is not None:
        yield event(
            shapes.usage_chunk(usage(last.usage.prompt_tokens, last.usage.completion_tokens))
        )
    yield event("[DONE]")
    await ended(None)


class EventStream(StreamingResponse):
    """text/event-stream whose body stops as soon as the client disconnects: the body is
    cancelled at once (not at its next write), and always closed."""

    def __init__(self, body: AsyncIterator[bytes], ended: Ended) -> None:
        self.ended = ended
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.create_task(self.stream_response(send))

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not streaming.done():
                streaming.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await asyncio.wait((streaming,))
        finally:
            watcher.cancel()
            if not streaming.done() and not streaming.cancelling():
                streaming.cancel()  # this request's task was cancelled (a shutdown)
            await asyncio.wait((streaming,))
            body = self.body_iterator
            if hasattr(body, "aclose"):
                await body.aclose()
            await self.ended(asyncio.CancelledError())  # a body closed before it started
        if not streaming.cancelled():
            failure = streaming.exception()
            if failure is not None and not isinstance(failure, OSError):
                raise failure
