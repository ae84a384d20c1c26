"""One request's output slot: the engine thread puts, the request's coroutine takes.

A slot holds at most one pending chunk: what the engine produces while the reader is slow
merges into it (token ids, text, log probabilities), so memory stays bounded whatever the
reader's pace. The reader is woken through its event loop only when the slot goes from
empty to full, one thread hop per burst rather than per token.
"""

from __future__ import annotations

import asyncio
import threading

from tensord.generate.outputs import RequestOutput


class OutputStream:
    """A merging single-slot channel from the engine thread to one coroutine."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self.closed = False
        """True once the last chunk or an error was put: nothing more will come."""

    def put(self, output: RequestOutput) -> None:
        """Engine thread: add a chunk (merged into one still pending)."""
        with self._lock:
            if self.closed:
                return
            wake = self._pending is None
            if self._pending is None:
                self._pending = output
            else:
                self._pending.merge(output)
            self.closed = output.finished
        if wake:
            self._wake()

    def fail(self, error: BaseException) -> None:
        """Engine thread: end the stream with an error after any pending chunk."""
        with self._lock:
            if self.closed:
                return
            self._error = error
            self.closed = True
        self._wake()

    async def get(self) -> RequestOutput:
        """The next (merged) chunk; raises the stream's error once its chunks are taken."""
        while True:
            with self._lock:
                pending, self._pending = self._pending, None
                if pending is None and self._error is not None:
                    raise self._error
                if pending is None:
                    self._ready.clear()
            if pending is not None:
                return pending
            await self._ready.wait()

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the loop has closed: nobody is reading any more
            pass
