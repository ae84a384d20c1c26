"""The engine's side of the links: every frontend's requests served by the one data plane.

The engine process owns the registry, the batchers, the executors and the generation
engines; frontends send it decoded calls. Each call runs as a task with the caller's
principal set, as it would in one process; its answer, or its error by class and message,
goes back on the caller's link. Generate chunks and answers leaving in the same pass of the
event loop go out as one message per link (one doorbell), so a step's chunks for all of a
frontend's streams cost one write. Whenever a version's state changes the engine publishes
the model table to every frontend.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from tensord.access import current_principal
from tensord.dataplane import DataPlane, GenerateCall, PredictCall
from tensord.errors import ResourceExhaustedError
from tensord.procs.link import Link
from tensord.procs.messages import (
    ErrorReport,
    pack_chunk,
    pack_result,
    unpack_call,
    wire_bytes,
)
from tensord.procs.ring import Ring
from tensord.server.context import StreamSlots

log = structlog.get_logger("tensord.engine")

_REPLY_MARGIN = 64 * 1024
"""Bytes counted for a reply beyond its tensors (its pickle and headers)."""
MAX_BACKLOG = 4096
"""Messages waiting for room in a frontend's reply ring before its link is dropped."""
QUERIES = frozenset({"info", "model_snapshots", "chat_prompt"})
"""The data plane methods a frontend may ask for by name (coroutines)."""


class FrontendLink:
    """One frontend's link and the calls it has running."""

    def __init__(self, index: int, host: EngineHost, outgoing: Ring, incoming: Ring) -> None:
        self.index = index
        self.host = host
        self.link = Link(outgoing, incoming, self._received)
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def post(self, message: Any, size: int = 0) -> None:
        """Send `message` (of `size` tensor bytes) with the others of this pass of the
        loop."""
        if self.link.closed:
            return
        self.link.post(message, size)
        if self.link.backlog > MAX_BACKLOG:
            # The frontend stopped reading (hung): its work is dropped rather than held in
            # memory without bound; the watchdog sees the frontend too.
            log.error("engine.frontend_not_reading", frontend=self.index,
                      backlog=self.link.backlog)  # fmt: skip
            self.host.remove_frontend(self.index)
            self.host.on_dropped(self.index)

    def _received(self, message: Any) -> None:
        kind = message[0]
        if kind == "batch":
            for each in message[1]:
                self._received(each)
        elif kind == "abort":
            task = self.tasks.get(message[1])
            if task is not None:
                task.cancel()
        elif kind == "predict":
            call = unpack_call(message[3])
            self._start(message[1], message[2], self._predict(message[1], call))
        elif kind == "generate":
            self._start(message[1], message[2], self._generate(message[1], message[3]))
        elif kind == "call":
            self._start(message[1], message[2], self._query(message[1], message[3], message[4]))
        else:
            log.error("engine.unknown_message", frontend=self.index, kind=str(kind)[:40])

    def _start(self, call_id: int, principal: Any, work: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            current_principal.set(principal)
            try:
                await work
            except asyncio.CancelledError:
                pass  # the frontend asked for it: nobody waits for an answer
            except Exception as exc:
                if not hasattr(exc, "code"):  # not a status error: the log has its cause
                    log.exception("engine.call_failed", frontend=self.index)
                self.post(("error", call_id, ErrorReport.of(exc)))

        def done(_task: asyncio.Task[None]) -> None:
            # Also for a task cancelled before its first step (its abort read in the same
            # batch as the call): `run` never ran, so its `finally` would not either.
            self.tasks.pop(call_id, None)
            work.close()  # never started then; a no-op for one that finished

        task = asyncio.get_running_loop().create_task(run())
        self.tasks[call_id] = task
        task.add_done_callback(done)

    async def _predict(self, call_id: int, call: PredictCall) -> None:
        result = await self.host.dataplane.predict(call)
        size = wire_bytes(result.outputs) + _REPLY_MARGIN
        if size > self.link.outgoing.max_payload:
            raise ResourceExhaustedError(
                f"the reply's tensors take {size - _REPLY_MARGIN} bytes, more than the ring "
                f"back to the frontend holds ({self.link.outgoing.max_payload} bytes: twice "
                "[server] max_send_message_bytes)"
            )
        self.post(("result", call_id, pack_result(result)), size)

    async def _generate(self, call_id: int, call: GenerateCall) -> None:
        slots = self.host.stream_slots
        with slots.held() if slots is not None else contextlib.nullcontext():
            chunks = self.host.dataplane.generate(call)
            try:
                async for chunk in chunks:
                    self.post(("chunk", call_id, pack_chunk(chunk)))
            finally:
                await chunks.aclose()  # a cancel aborts the sequence and frees its blocks
        self.post(("chunk", call_id, None))

    async def _query(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        if method not in QUERIES:
            raise ValueError(f"no data plane query {method!r}")
        function: Callable[..., Awaitable[Any]] = getattr(self.host.dataplane, method)
        self.post(("ok", call_id, await function(*args)))

    def close(self) -> None:
        """The frontend is gone: cancel what it had running (streams free their blocks)."""
        for task in list(self.tasks.values()):
            task.cancel()
        self.link.close()


class EngineHost:
    """Serves frontends' links from `dataplane` and publishes its model table."""

    def __init__(self, dataplane: DataPlane, max_generate_streams: int = 0) -> None:
        self.dataplane = dataplane
        self.stream_slots = StreamSlots(max_generate_streams) if max_generate_streams else None
        self.on_dropped: Callable[[int], None] = lambda index: None
        """Called with a frontend's index when its link is dropped for not reading (the
        supervisor starts that frontend again)."""
        """[limits] max_generate_streams across every frontend (each frontend also holds
        its own slots, so none takes more than the limit either)."""
        self.frontends: dict[int, FrontendLink] = {}
        self.loaded = False
        self._publish_handle: asyncio.Handle | None = None

    def add_frontend(self, index: int, outgoing: Ring, incoming: Ring) -> None:
        """Serve frontend `index` over these rings (a frontend restarted replaces its link)."""
        old = self.frontends.pop(index, None)
        if old is not None:
            old.close()
        frontend = FrontendLink(index, self, outgoing, incoming)
        self.frontends[index] = frontend
        frontend.link.open()
        frontend.post(("table", self.dataplane.table(self.loaded)))

    def remove_frontend(self, index: int) -> None:
        frontend = self.frontends.pop(index, None)
        if frontend is not None:
            frontend.close()

    def models_changed(self) -> None:
        """A version's state changed: publish the table once this pass of the loop ends."""
        if self._publish_handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a load finishing as the loop closes
                return
            self._publish_handle = loop.call_soon(self._publish)

    def _publish(self) -> None:
        self._publish_handle = None
        table = self.dataplane.table(self.loaded)
        for frontend in self.frontends.values():
            frontend.post(("table", table))

    def running(self) -> int:
        """Calls in progress across frontends."""
        return sum(len(f.tasks) for f in self.frontends.values())

    def close(self) -> None:
        for index in list(self.frontends):
            self.remove_frontend(index)
