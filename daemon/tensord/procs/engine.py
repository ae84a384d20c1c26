"""The engine's side of the links: every frontend's calls served by one LocalEngine.

The engine process owns the registry, the batchers, the executors and the generation
engines; frontends send it calls their data planes have checked, tokenised and admitted,
for exact versions. A Predict or a query runs as a task; its answer, or its error by class
and message, goes back on the caller's link. A frontend's link is the sink of the
generations it started: each engine step's token ids for all of its streams go out as one
message (the frontend makes the text), and messages leaving in the same pass of the event
loop go as one record (one doorbell). Whenever a version's state changes the engine
publishes the model table to every frontend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import structlog

from tensord.dataplane import (
    EmbedTokens,
    EngineCoreRequest,
    LocalEngine,
    PredictCall,
    PredictResult,
)
from tensord.errors import InternalError, ResourceExhaustedError
from tensord.generate.core.outputs import EngineCoreOutput
from tensord.procs import messages
from tensord.procs.link import Link
from tensord.procs.messages import ErrorReport, wire_bytes
from tensord.procs.ring import Ring
from tensord.server.kit.rpc import StreamSlots

log = structlog.get_logger("tensord.engine")

_REPLY_MARGIN = 64 * 1024
"""Bytes counted for a reply beyond its tensors (its pickle and headers)."""
MAX_BACKLOG = 4096
"""Messages waiting for room in a frontend's reply ring before its link is dropped."""
QUERIES = frozenset({"info", "snapshots"})
"""The LocalEngine methods a frontend may ask for by name (coroutines)."""
CONTROL_QUERIES = frozenset({"load_model", "unload_model", "repository_index"})
"""Its model control's methods (the registry's), asked for the same way."""


class FrontendLink:
    """One frontend's link, the calls it has running, and the sink of its generations."""

    def __init__(self, index: int, host: EngineHost, outgoing: Ring, incoming: Ring) -> None:
        self.index = index
        self.host = host
        self.link = Link(outgoing, incoming, self._received, self._unsendable)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        """Predict calls and queries running, by call id."""
        self.generations: dict[int, str] = {}
        """Generations running, by call id: the engine's request id."""
        self.call_ids: dict[str, int] = {}
        """The same, by request id."""

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

    def _received(self, message: messages.Message) -> None:
        match message:
            case messages.Batch(each):
                for one in each:
                    self._received(one)
            case messages.Generate(call_id, request):
                self._generate(call_id, request)
            case messages.Abort(call_id):
                self._abort(call_id)
            case messages.Stop(ids):
                found = [r for c in ids if (r := self.generations.get(c)) is not None]
                self.host.engine.stop_generations(found)
            case messages.Predict():
                call_id = message.id
                self._start(call_id, self._predict(call_id, messages.call_of(message)))
            case messages.Embed():
                call_id = message.id
                self._start(call_id, self._embed(call_id, messages.embed_of(message)))
            case messages.Query(call_id, method, args):
                arguments = messages.unpickled(args)
                self._start(call_id, self._query(call_id, method, arguments))
            case _:
                log.error("engine.unknown_message", frontend=self.index,
                          kind=type(message).__name__)  # fmt: skip

    def _unsendable(self, message: messages.Single, exc: Exception) -> None:
        """An answer could not be written: its call, or its step's generations, fail with a
        short error instead of waiting."""
        report = ErrorReport.of(
            InternalError(
                f"the engine could not pass its answer back ({type(exc).__name__}); the "
                "server log has the details (link.unsendable)"
            )
        )
        if isinstance(message, messages.Result | messages.Ok):
            self.post(messages.Error(message.id, report))
        elif isinstance(message, messages.Tokens):
            ids = [output.call_id for output in message.outputs]
            for call_id in ids:
                request_id = self.generations.get(call_id)
                if request_id is not None:
                    self.host.engine.abort_generation(request_id)
            self.post(messages.Ended(ids, report))

    def _abort(self, call_id: int) -> None:
        task = self.tasks.get(call_id)
        if task is not None:
            task.cancel()
        request_id = self.generations.get(call_id)
        if request_id is not None:
            self.host.engine.abort_generation(request_id)

    def _start(self, call_id: int, work: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            try:
                await work
            except asyncio.CancelledError:
                pass  # the frontend asked for it: nobody waits for an answer
            except Exception as exc:
                if not hasattr(exc, "code"):  # not a status error: the log has its cause
                    log.exception("engine.call_failed", frontend=self.index)
                self.post(messages.Error(call_id, ErrorReport.of(exc)))

        def done(_task: asyncio.Task[None]) -> None:
            # Also for a task cancelled before its first step (its abort read in the same
            # batch as the call): `run` never ran, so its `finally` would not either.
            self.tasks.pop(call_id, None)
            work.close()  # never started then; a no-op for one that finished

        task = asyncio.get_running_loop().create_task(run())
        self.tasks[call_id] = task
        task.add_done_callback(done)

    async def _predict(self, call_id: int, call: PredictCall) -> None:
        result = await self.host.engine.predict(call)
        size = wire_bytes(result.outputs) + _REPLY_MARGIN
        if size > self.link.outgoing.max_payload:
            raise ResourceExhaustedError(
                f"the reply's tensors take {size - _REPLY_MARGIN} bytes, more than the ring "
                f"back to the frontend holds ({self.link.outgoing.max_payload} bytes: twice "
                "[server] max_send_message_bytes)"
            )
        self.post(messages.result(call_id, result), size)

    async def _embed(self, call_id: int, call: EmbedTokens) -> None:
        result = await self.host.engine.embed(call)
        size = result.vectors.nbytes + _REPLY_MARGIN
        if size > self.link.outgoing.max_payload:
            raise ResourceExhaustedError(
                f"the vectors take {size - _REPLY_MARGIN} bytes, more than the ring back to "
                f"the frontend holds ({self.link.outgoing.max_payload} bytes: twice [server] "
                "max_send_message_bytes); send fewer texts a request"
            )
        vectors = [("embedding", result.vectors)]
        done = PredictResult(
            result.model, result.version, vectors, result.queue_s, result.compute_s
        )
        self.post(messages.result(call_id, done), size)

    def _generate(self, call_id: int, request: EngineCoreRequest) -> None:
        """Start a generation; a refusal (queue full, no stream slot) answers at once."""
        slots = self.host.stream_slots
        request_id = ""

        def ended() -> None:
            self.generations.pop(call_id, None)
            self.call_ids.pop(request_id, None)
            if slots is not None:
                slots.give()

        try:
            if slots is not None:
                slots.take()
            try:
                request_id = self.host.engine.add_generation(request, self, ended)
            except BaseException:
                if slots is not None:
                    slots.give()
                raise
        except Exception as exc:
            if not hasattr(exc, "code"):
                log.exception("engine.call_failed", frontend=self.index)
            self.post(messages.Error(call_id, ErrorReport.of(exc)))
            return
        self.generations[call_id] = request_id
        self.call_ids[request_id] = call_id

    async def _query(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        if method not in QUERIES | CONTROL_QUERIES:
            raise ValueError(f"no engine query {method!r}")
        engine = self.host.engine
        target = engine.control if method in CONTROL_QUERIES else engine
        function: Callable[..., Awaitable[Any]] = getattr(target, method)
        self.post(messages.ok(call_id, await function(*args)))

    # -- OutputSink: the outputs of this frontend's generations --------------------------

    def outputs(self, outputs: list[EngineCoreOutput]) -> None:
        self.post(messages.tokens(outputs, self.call_ids))

    def failed(self, request_ids: Sequence[str], error: Exception) -> None:
        ids = [self.call_ids[r] for r in request_ids if r in self.call_ids]
        self.post(messages.Ended(ids, ErrorReport.of(error)))

    def expired(self, request_ids: Sequence[str]) -> None:
        ids = [self.call_ids[r] for r in request_ids if r in self.call_ids]
        self.post(messages.Ended(ids, None))

    def close(self) -> None:
        """The frontend is gone: cancel what it had running (streams free their KV)."""
        for task in list(self.tasks.values()):
            task.cancel()
        for request_id in list(self.call_ids):
            self.host.engine.abort_generation(request_id)
        self.link.close()


class EngineHost:
    """Serves frontends' links from `engine` and publishes its model table."""

    def __init__(self, engine: LocalEngine, max_generate_streams: int = 0) -> None:
        self.engine = engine
        engine.on_table = self.models_changed
        self.stream_slots = StreamSlots(max_generate_streams) if max_generate_streams else None
        self.on_dropped: Callable[[int], None] = lambda index: None
        """Called with a frontend's index when its link is dropped for not reading (the
        supervisor starts that frontend again)."""
        """[limits] max_generate_streams across every frontend (each frontend also holds
        its own slots, so none takes more than the limit either)."""
        self.frontends: dict[int, FrontendLink] = {}
        self._publish_handle: asyncio.Handle | None = None

    def add_frontend(self, index: int, outgoing: Ring, incoming: Ring) -> None:
        """Serve frontend `index` over these rings (a frontend restarted replaces its link)."""
        old = self.frontends.pop(index, None)
        if old is not None:
            old.close()
        frontend = FrontendLink(index, self, outgoing, incoming)
        self.frontends[index] = frontend
        frontend.link.open()
        frontend.post(messages.table(self.engine.table))

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
        table = messages.table(self.engine.table)  # pickled once for every frontend
        for frontend in self.frontends.values():
            frontend.post(table)

    def running(self) -> int:
        """Calls in progress across frontends."""
        return sum(len(f.tasks) + len(f.generations) for f in self.frontends.values())

    def close(self) -> None:
        for index in list(self.frontends):
            self.remove_frontend(index)
