"""The engine process as a frontend's data plane reaches it: the EngineClient over a link.

The model table the engine publishes is at hand (health, readiness, lookups and admission
need no round trip, and answer while the engine is busy or restarting); Predict, each
Generate request and the queries that need live state go to the engine. A Generate
request's tokens come back once per engine step for all of this frontend's streams, and
the data plane makes their text here. A call whose client goes away sends an abort, so
the engine stops its work (a sequence frees its KV cache). While no engine is linked,
calls get UNAVAILABLE; when an engine dies, every call waiting on it does too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
from tokenizers import Tokenizer

from tensord.config import TensordConfig
from tensord.dataplane import (
    EmbedResult,
    EmbedTokens,
    EngineCoreRequest,
    IndexEntry,
    ModelSnapshot,
    ModelTable,
    PredictCall,
    PredictResult,
    Readiness,
    RepositoryChanges,
    ServerInfo,
    TableEntry,
)
from tensord.embedding.tokenizer import embedding_tokenizer
from tensord.errors import (
    DeviceLostError,
    InternalError,
    ResourceExhaustedError,
    UnavailableError,
)
from tensord.generate.core.outputs import EngineCoreOutput
from tensord.generate.engine.streams import OutputSink
from tensord.generate.model.model_dir import load_tokenizer
from tensord.procs import messages
from tensord.procs.link import Link
from tensord.procs.messages import wire_bytes
from tensord.procs.ring import Ring

log = structlog.get_logger("tensord.procs")

ENGINE_GONE = "the engine process restarted while this call was in it; retry"
NO_ENGINE = "the engine process is starting or restarting; retry shortly"
_RING_MARGIN = 64 * 1024
"""Room kept in the request ring beyond a call's tensors (its pickle and headers)."""


class _RemoteControl:
    """Model control in the engine process, over the control queries."""

    def __init__(self, engine: RemoteEngine) -> None:
        self._engine = engine

    async def load_model(self, name: str) -> RepositoryChanges:
        changes: RepositoryChanges = await self._engine.query("load_model", name)
        return changes

    async def unload_model(self, name: str) -> bool:
        done: bool = await self._engine.query("unload_model", name)
        return done

    async def repository_index(self) -> list[IndexEntry]:
        index: list[IndexEntry] = await self._engine.query("repository_index")
        return index


class RemoteEngine:
    """The EngineClient of a frontend process: the engine process over a link."""

    def __init__(self, config: TensordConfig) -> None:
        self.on_table: Callable[[], None] = lambda: None
        self.on_device_lost: Callable[[DeviceLostError], None] = lambda exc: None
        """Never called here: the engine process restarts itself after a lost device."""
        self._table = ModelTable(False, Readiness(False, "the engine process is starting"))
        self._link: Link | None = None
        self._ids = itertools.count(1)
        self.control = _RemoteControl(self)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._sinks: dict[int, OutputSink] = {}
        """Each generation in the engine, by call id: where its outputs go."""
        self._loaded = asyncio.Event()
        self._tokenizers: dict[tuple[str, int], Tokenizer] = {}
        """By tokenizer file and the load of the version that serves it."""
        self._reading: set[tuple[str, int]] = set()
        self._reads: set[asyncio.Task[None]] = set()

    @property
    def table(self) -> ModelTable:
        return self._table

    # -- the link ----------------------------------------------------------------------

    def attach(self, outgoing: Ring, incoming: Ring) -> None:
        """Use a (new) engine's rings; calls waiting on an old one get UNAVAILABLE."""
        self.detach()
        self._tokenizers.clear()  # a new engine may serve new files under the same paths
        self._link = Link(outgoing, incoming, self._received, self._unsendable)
        self._link.open()

    def detach(self, message: str = ENGINE_GONE) -> None:
        """The engine is gone: every waiting call and stream ends with UNAVAILABLE, and
        health says NOT_SERVING until an engine is back."""
        link, self._link = self._link, None
        if link is not None:
            link.close()
            reason = "the engine process is restarting"
            self._table = dataclasses.replace(self._table, readiness=Readiness(False, reason))
            self.on_table()
        error = UnavailableError(message)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        self._waiting.clear()
        sinks, self._sinks = self._sinks, {}
        for call_id, sink in sinks.items():
            sink.failed([str(call_id)], error)

    def _received(self, message: messages.Message) -> None:
        match message:
            case messages.Batch(each):
                for one in each:
                    self._received(one)
            case messages.Tokens(outputs):
                self._tokens(outputs)
            case messages.Ended(ids, report):
                self._ended(ids, report)
            case messages.Result() | messages.Ok() | messages.Error():
                self._answered(message)
            case messages.Table(table):
                self._new_table(messages.unpickled(table))
            case _:
                log.error("frontend.unknown_message", kind=type(message).__name__)

    def _unsendable(self, message: messages.Single, exc: Exception) -> None:
        """A call's message could not reach the engine: the call fails rather than wait."""
        call_id = getattr(message, "id", None)
        if call_id is None:  # an abort or a stop: nobody waits for it
            return
        error = InternalError(
            f"the call could not be passed to the engine process ({type(exc).__name__}); the "
            "server log has the details (link.unsendable)"
        )
        future = self._waiting.pop(call_id, None)
        if future is not None and not future.done():
            future.set_exception(error)
        sink = self._sinks.pop(call_id, None)
        if sink is not None:
            sink.failed([str(call_id)], error)

    def _ended(self, ids: list[int], report: messages.ErrorReport | None) -> None:
        error = None if report is None else report.exception()
        for call_id in ids:
            sink = self._sinks.pop(call_id, None)
            if sink is None:
                continue
            if error is None:
                sink.expired([str(call_id)])
            else:
                sink.failed([str(call_id)], error)

    def _new_table(self, table: ModelTable) -> None:
        self._table = table
        keys = {(e.tokenizer_path, e.serial) for e in table.versions}
        for gone in set(self._tokenizers) - keys:  # versions no longer served
            del self._tokenizers[gone]
        self._preload_tokenizers()
        if table.loaded:
            self._loaded.set()
        self.on_table()

    def _tokens(self, outputs: list[messages.Output]) -> None:
        """A step's outputs for this frontend's generations, to their sinks."""
        groups: dict[int, tuple[OutputSink, list[EngineCoreOutput]]] = {}
        for item in outputs:
            call_id = item.call_id
            sink = self._sinks.get(call_id)
            if sink is None:
                continue  # aborted meanwhile
            if item.status is not None:  # finished
                del self._sinks[call_id]
            group = groups.get(id(sink))
            if group is None:
                groups[id(sink)] = (sink, [messages.output_of(item)])
            else:
                group[1].append(messages.output_of(item))
        for sink, batch in groups.values():
            sink.outputs(batch)

    def _answered(self, message: messages.Result | messages.Ok | messages.Error) -> None:
        future = self._waiting.pop(message.id, None)
        if future is not None and not future.done():
            if isinstance(message, messages.Result):
                future.set_result(messages.result_of(message))
            elif isinstance(message, messages.Ok):
                future.set_result(messages.unpickled(message.result))
            else:
                future.set_exception(message.report.exception())
        elif isinstance(message, messages.Error):  # a generation the engine refused
            sink = self._sinks.pop(message.id, None)
            if sink is not None:
                sink.failed([str(message.id)], message.report.exception())

    def _send(self, message: Any, tensor_bytes: int = 0) -> None:
        link = self._link
        if link is None:
            raise UnavailableError(NO_ENGINE)
        if tensor_bytes + _RING_MARGIN > link.outgoing.max_payload:
            raise ResourceExhaustedError(
                f"the request's tensors take {tensor_bytes} bytes, more than a frontend's "
                f"ring to the engine holds ({link.outgoing.max_payload} bytes)"
            )
        room = link.outgoing.free_bytes() - link.pending_bytes
        if tensor_bytes + _RING_MARGIN > room or link.backlog:
            raise ResourceExhaustedError(
                "the engine's request ring is full (calls in flight hold its space); "
                "retry shortly, or lower the load on this server"
            )
        link.post(message, tensor_bytes + _RING_MARGIN)

    async def _ask(
        self, message: messages.Predict | messages.Embed | messages.Query, tensor_bytes: int = 0
    ) -> Any:
        call_id = message.id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        try:
            self._send(message, tensor_bytes)
            return await future
        except asyncio.CancelledError:
            self._post(messages.Abort(call_id))
            raise
        finally:
            self._waiting.pop(call_id, None)

    def _post(self, message: Any) -> None:
        link = self._link
        if link is not None and not link.closed:
            link.post(message)

    # -- EngineClient ------------------------------------------------------------------

    async def predict(self, call: PredictCall) -> PredictResult:
        message = messages.predict(next(self._ids), call)
        result: PredictResult = await self._ask(message, wire_bytes(call.inputs))
        return result

    async def embed(self, call: EmbedTokens) -> EmbedResult:
        message = messages.embed(next(self._ids), call)
        size = call.token_ids.nbytes + call.lengths.nbytes
        done: PredictResult = await self._ask(message, size)
        ((_, vectors),) = done.outputs
        tokens = int(call.lengths.sum())
        return EmbedResult(done.model, done.version, vectors, tokens, done.queue_s, done.compute_s)

    def add_generation(self, request: EngineCoreRequest, sink: OutputSink) -> str:
        call_id = next(self._ids)
        self._send(messages.Generate(call_id, request), 16 * len(request.prompt_token_ids))
        self._sinks[call_id] = sink
        return str(call_id)

    def abort_generation(self, request_id: str) -> None:
        call_id = int(request_id)
        if self._sinks.pop(call_id, None) is not None:
            self._post(messages.Abort(call_id))

    def stop_generations(self, request_ids: Sequence[str]) -> None:
        stopped = [int(r) for r in request_ids if self._sinks.pop(int(r), None) is not None]
        if stopped:
            self._post(messages.Stop(stopped))

    def _preload_tokenizers(self) -> None:
        """Read each READY generator's tokenizer on a worker thread as soon as the table
        names it, so that the first request does not read a large tokenizer.json on the
        event loop (a request arriving before it is read reads it itself)."""
        for entry in self._table.versions:
            key = (entry.tokenizer_path, entry.serial)
            serves_text = entry.generator is not None or entry.embedding is not None
            if not serves_text or key in self._tokenizers or key in self._reading:
                continue
            self._reading.add(key)
            task = asyncio.get_running_loop().create_task(self._read_tokenizer(key, entry))
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)

    async def _read_tokenizer(self, key: tuple[str, int], entry: TableEntry) -> None:
        try:
            tokenizer = await asyncio.to_thread(_read_tokenizer, entry)
        except Exception as exc:  # the request that needs it reads it and answers why
            log.warning("frontend.tokenizer_unread", path=key[0], error=repr(exc))
            return
        finally:
            self._reading.discard(key)
        if any((e.tokenizer_path, e.serial) == key for e in self._table.versions):
            self._tokenizers.setdefault(key, tokenizer)

    def tokenizer(self, entry: TableEntry) -> Tokenizer:
        """The version's tokenizer, read here from its file (once per load)."""
        key = (entry.tokenizer_path, entry.serial)
        tokenizer = self._tokenizers.get(key)
        if tokenizer is None:
            tokenizer = self._tokenizers[key] = _read_tokenizer(entry)
        return tokenizer

    async def query(self, method: str, *args: Any) -> Any:
        """A control-plane query to the engine process (tensord.procs.engine.QUERIES)."""
        return await self._ask(messages.query(next(self._ids), method, args))

    async def info(self) -> ServerInfo:
        info: ServerInfo = await self.query("info")
        return info

    async def snapshots(self, model: str) -> list[ModelSnapshot]:
        message = messages.query(next(self._ids), "snapshots", (model,))
        snapshots: list[ModelSnapshot] = await self._ask(message)
        return snapshots

    def apply(self, config: TensordConfig) -> None:
        """The engine process reads the configuration again itself."""

    async def load_models(self) -> None:
        """Until the engine has loaded the repository (its table says so)."""
        await self._loaded.wait()

    async def reload_models(self, repository: Path) -> RepositoryChanges:
        """The engine reloads the models (the supervisor tells it); nothing here."""
        return RepositoryChanges()

    def terminate_runs(self) -> None:
        """Runs belong to the engine: the supervisor drains it after the frontends."""

    async def close(self) -> None:
        self.detach("the server is shutting down")


def _read_tokenizer(entry: TableEntry) -> Tokenizer:
    """A version's tokenizer from its file: an embedding model's truncating at its
    max_seq_length, as in the engine."""
    if entry.embedding is not None:
        return embedding_tokenizer(Path(entry.tokenizer_path), entry.embedding.max_seq_length)
    return load_tokenizer(Path(entry.tokenizer_path))
