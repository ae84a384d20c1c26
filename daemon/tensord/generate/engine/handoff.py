"""The hand-off of a generation engine's outputs from its thread to the event loop.

The engine thread holds each step's outputs and hands them over just before a model pass,
so that the loop's per-token work (text, chunks, gRPC messages) overlaps the pass, which
runs without the GIL, instead of competing with the step's own Python. Every
`stream_interval` passes everything held goes, so a stream gets one chunk for that many
steps' tokens; in between only the requests whose first token or last chunk is held go
(time to first token and the end of a stream never wait). While the loop has not yet taken
what was handed over, later hand-overs join it: a busy loop gets the tokens of several
steps in one call, and each stream one merged chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable

from tensord.generate.core.outputs import EngineCoreOutput

_AUTO_STREAMS_PER_CHUNK = 4
_AUTO_MAX_INTERVAL = 8


def stream_interval(configured: int, streams: int) -> int:
    """Steps whose tokens one chunk carries: `configured`, or with 0 ("auto")
    ceil(streams / 4) capped at 8, which keeps about 4 chunks per step."""
    if configured:
        return configured
    return max(1, min(_AUTO_MAX_INTERVAL, -(-streams // _AUTO_STREAMS_PER_CHUNK)))


class OutputHandoff:
    """Engine thread → event loop: step outputs held, released when due, delivered once per
    loop turn to `deliver` (which runs on the loop)."""

    def __init__(
        self, deliver: Callable[[list[EngineCoreOutput]], None], configured_interval: int
    ) -> None:
        self._deliver_outputs = deliver
        self._interval = configured_interval
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop the streams are read on (set when a request is admitted)."""
        self._outbox: list[EngineCoreOutput] = []
        self._outbox_lock = threading.Lock()
        self._outbox_scheduled = False
        self._held: list[EngineCoreOutput] = []
        """Engine thread: outputs of steps not yet handed over (see release_due)."""
        self._held_steps = 0
        """Engine thread: model passes started since everything held was last handed over."""
        self._urgent: set[str] = set()
        """Engine thread: held requests whose tokens go at the next pass (first, last)."""

    # -- the engine thread -------------------------------------------------------------

    def hold(self, outputs: Iterable[EngineCoreOutput], urgent: Iterable[str]) -> None:
        """Keep a step's outputs until they are due; `urgent` requests go at the next pass."""
        self._urgent.update(urgent)
        self._held.extend(outputs)

    def release_held(self) -> None:
        """Hand every held output to the event loop. Called before the engine waits and
        before anything else is posted to the loop (an expiry, an error), and by
        release_due when the stream interval is up."""
        self._held_steps = 0
        self._urgent.clear()
        if self._held:
            held, self._held = self._held, []
            self._hand_over(held)

    def release_due(self, streams: int) -> None:
        """Just before a model pass: hand over the held outputs that are due."""
        self._held_steps += 1
        if self._held_steps >= stream_interval(self._interval, streams):
            self.release_held()
            return
        if self._urgent:
            urgent, self._urgent = self._urgent, set()
            due = [o for o in self._held if o.request_id in urgent]
            self._held = [o for o in self._held if o.request_id not in urgent]
            self._hand_over(due)

    def call_after_held(self, fn: Callable[..., None], *args: object) -> None:
        """Run fn(*args) on the event loop after the outputs held so far, so a stream's
        tokens always reach the loop before its end (an expiry, an error)."""
        self.release_held()
        self._post(fn, *args)

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        """Run fn(*args) on the event loop (dropped when it has closed)."""
        loop = self.loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)

    def _hand_over(self, outputs: list[EngineCoreOutput]) -> None:
        """Queue outputs for the loop. While the loop has not yet taken the last ones,
        later ones join them (fewer messages exactly when the loop is the bottleneck, one
        per token when it keeps up)."""
        with self._outbox_lock:
            self._outbox.extend(outputs)
            if self._outbox_scheduled:
                return
            self._outbox_scheduled = True
        self._post(self._deliver)

    # -- the event loop ----------------------------------------------------------------

    def _deliver(self) -> None:
        with self._outbox_lock:
            outputs, self._outbox = self._outbox, []
            self._outbox_scheduled = False
        self._deliver_outputs(outputs)
