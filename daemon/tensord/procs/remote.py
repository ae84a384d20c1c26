"""A frontend's data plane: the engine's, reached over a link, with the model table at hand.

It answers what the gRPC servicers ask of a data plane. Health, readiness and the checks
made before a Generate request is parsed come from the model table the engine publishes
(no round trip, and they answer while the engine is busy or restarting); Predict, Generate
and the queries that need live state go to the engine. A call whose client goes away sends
an abort, so the engine stops its work (a sequence frees its KV blocks). While no engine is
linked, calls get UNAVAILABLE; when an engine dies, every call waiting on it does too.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tensord.access import check_model, current_principal, may_see, redact_paths
from tensord.config import TensordConfig
from tensord.dataplane import (
    NOT_SERVING,
    GenerateCall,
    HealthReport,
    ModelHealth,
    ModelSnapshot,
    ModelState,
    ModelTable,
    PredictCall,
    PredictResult,
    Readiness,
    RepositoryChanges,
    RequestOutput,
    ServerInfo,
    TableEntry,
)
from tensord.dataplane.admission import GenerateFields, admit, text_bytes
from tensord.dataplane.plane import each_token_text, off_loop
from tensord.errors import (
    DeviceLostError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
)
from tensord.generate.model.model_dir import encode_text, load_tokenizer
from tensord.predict.validation import check_inputs, check_output_names
from tensord.procs.link import Link
from tensord.procs.messages import pack_call, unpack_chunk, unpack_result, wire_bytes
from tensord.procs.ring import Ring

ENGINE_GONE = "the engine process restarted while this call was in it; retry"
NO_ENGINE = "the engine process is starting or restarting; retry shortly"
_RING_MARGIN = 64 * 1024
"""Room kept in the request ring beyond a call's tensors (its pickle and headers)."""


class _Stream:
    """One Generate stream's chunks from the engine, waiting for its caller. As in one
    process (RequestOutputCollector), chunks the caller has not taken yet merge into one,
    never into the first (the time to first token), so a slow reader holds at most two.
    None ends the stream; an exception fails it."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._ready = asyncio.Event()
        self._taken_first = False
        self.started = False
        """A chunk has arrived (the engine admitted the request)."""

    def put(self, item: Any) -> None:
        items = self._items
        last = items[-1] if items else None
        first_waiting = len(items) == 1 and not self._taken_first
        if (
            isinstance(item, RequestOutput)
            and isinstance(last, RequestOutput)
            and not first_waiting
        ):
            last.merge(item)
        else:
            items.append(item)
        if isinstance(item, RequestOutput):
            self.started = True
        self._ready.set()

    async def get(self) -> Any:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, RequestOutput):
            self._taken_first = True
        return item


class RemoteDataPlane:
    """The DataPlane interface the servers use, over a link to the engine process."""

    def __init__(self, config: TensordConfig) -> None:
        self.serving = False
        self.ready_when = config.server.ready_when
        self.max_prompt_tokens = config.limits.max_prompt_tokens
        self.repository = config.model_repository
        self.generation_metrics: Any = None
        self.on_device_lost: Callable[[DeviceLostError], None] = lambda exc: None
        self.table = ModelTable(False, Readiness(False, "the engine is starting"))
        self.on_table: Callable[[], None] = lambda: None
        """Called when a new table arrives (the server re-publishes health)."""
        self._link: Link | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, _Stream] = {}
        self._loaded = asyncio.Event()
        self._tokenizers: dict[str, Tokenizer] = {}

    # The link.

    def attach(self, outgoing: Ring, incoming: Ring) -> None:
        """Use a (new) engine's rings; calls waiting on an old one get UNAVAILABLE."""
        self.detach()
        self._link = Link(outgoing, incoming, self._received)
        self._link.open()

    def detach(self, message: str = ENGINE_GONE) -> None:
        """The engine is gone: every waiting call and stream ends with UNAVAILABLE."""
        link, self._link = self._link, None
        if link is not None:
            link.close()
            self.on_table()  # health follows: NOT_SERVING until an engine is back
        error = UnavailableError(message)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        self._waiting.clear()
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()

    def _received(self, message: Any) -> None:
        kind = message[0]
        if kind == "batch":
            for each in message[1]:
                self._received(each)
        elif kind == "chunk":
            stream = self._streams.get(message[1])
            if stream is not None:
                packed = message[2]
                stream.put(None if packed is None else unpack_chunk(packed))
        elif kind == "ok" or kind == "result" or kind == "error":
            future = self._waiting.pop(message[1], None)
            ended = self._streams.pop(message[1], None)
            if kind == "result" and future is not None and not future.done():
                future.set_result(unpack_result(message[2]))
            elif kind == "ok" and future is not None and not future.done():
                future.set_result(message[2])
            elif kind == "error":
                error = message[2].exception()
                if future is not None and not future.done():
                    future.set_exception(error)
                if ended is not None:
                    ended.put(error)
        elif kind == "table":
            self.table = message[1]
            paths = {e.tokenizer_path for e in self.table.versions}
            for gone in set(self._tokenizers) - paths:  # versions no longer served
                del self._tokenizers[gone]
            if self.table.loaded:
                self._loaded.set()
            self.on_table()

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

    async def _ask(self, message: tuple[Any, ...], tensor_bytes: int = 0) -> Any:
        call_id = message[1]
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        try:
            self._send(message, tensor_bytes)
            return await future
        except asyncio.CancelledError:
            self._abort(call_id)
            raise
        finally:
            self._waiting.pop(call_id, None)

    def _abort(self, call_id: int) -> None:
        link = self._link
        if link is not None and not link.closed:
            link.post(("abort", call_id))

    # What the servers call.

    async def predict(self, call: PredictCall) -> PredictResult:
        """Checked here against the table's signature of the version that serves (a bad
        request never reaches the engine), then run by the engine."""
        self._check_serving()
        check_model(call.model)
        entry = self._ready(call.model, call.version, "predict")
        if entry is not None:
            inputs = check_inputs(entry.name, entry.inputs, call.inputs, entry.max_batch_size)
            names = check_output_names(entry.name, entry.outputs, call.output_names)
            call = PredictCall(
                call.model, call.version, list(inputs.items()), names, call.deadline, entry.version
            )
        size = wire_bytes(call.inputs)
        message = ("predict", next(self._ids), current_principal.get(), pack_call(call))
        result: PredictResult = await self._ask(message, size)
        return result

    async def generate(self, call: GenerateCall) -> AsyncGenerator[RequestOutput, None]:
        self._check_serving()
        check_model(call.model)
        prompt_bytes = text_bytes(call.prompt)
        # By size first: a prompt certainly too long is never tokenised.
        self.check_prompt_size(call.model, call.version, prompt_bytes, len(call.prompt_token_ids))
        if call.prompt and not call.prompt_token_ids:
            await self._tokenize(call)
        self._admit(call)
        call_id = next(self._ids)
        stream = _Stream()
        self._streams[call_id] = stream
        finished = False
        try:
            ids = len(call.prompt_token_ids) + len(call.tokenized or ())
            size = prompt_bytes + 16 * ids
            self._send(("generate", call_id, current_principal.get(), call), size)
            while True:
                item = await stream.get()
                if item is None:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            self._streams.pop(call_id, None)
            if not finished:
                self._abort(call_id)

    def _admit(self, call: GenerateCall) -> None:
        """The engine's admission check, here where the table has the version READY: a
        prompt too long for the model is refused as one process refuses it, not for the
        room its tokens would take in the ring."""
        entry = self._ready(call.model, call.version, "generator")
        if entry is None or entry.generator is None:
            return
        if call.prompt and (call.tokenized is None or call.tokenized_version != entry.version):
            return
        ids = call.tokenized if call.prompt else call.prompt_token_ids
        fields = GenerateFields(
            token_ids=len(call.prompt_token_ids),
            prompt_token_ids=list(ids or ()),
            text=bool(call.prompt),
            sampling=call.sampling,
        )
        admit(fields, entry.generator)

    async def _query(self, method: str, *args: Any, size: int = 0) -> Any:
        """The engine's data plane's `method(*args)`; `size`: what its arguments take in
        the ring beyond the margin every message has."""
        message = ("call", next(self._ids), current_principal.get(), method, args)
        return await self._ask(message, size)

    async def chat_prompt(self, model: str, version: int, messages: list[dict[str, Any]]) -> Any:
        """Rendered and tokenised by the engine; the messages' size is given to the ring,
        so that a conversation larger than it holds is refused, never dropped."""
        self._check_serving()
        check_model(model)
        size = sum(len(str(m.get("content") or "")) * 4 + 256 for m in messages)
        return await self._query("chat_prompt", model, version, messages, size=size)

    async def info(self) -> ServerInfo:
        info: ServerInfo = await self._query("info")
        return info

    async def model_snapshots(self, model: str = "") -> list[ModelSnapshot]:
        if model:
            check_model(model)
        snapshots: list[ModelSnapshot] = await self._query("model_snapshots", model)
        return snapshots

    async def _tokenize(self, call: GenerateCall) -> None:
        """The text prompt's token ids, made here with the tokenizer of the version the
        table says serves (long texts on a worker thread), so that the engine does not;
        when the table has no READY version, the engine tokenises (and answers why not)."""
        entry = self._ready(call.model, call.version, "generator")
        if entry is None:
            return
        tokenizer = self._tokenizer(entry.tokenizer_path)
        ids = await off_loop(call.prompt, functools.partial(encode_text, tokenizer))
        call.tokenized = [*entry.prompt_prefix, *ids]
        call.tokenized_version = entry.version

    def _tokenizer(self, path: str) -> Tokenizer:
        tokenizer = self._tokenizers.get(path)
        if tokenizer is None:
            tokenizer = self._tokenizers[path] = load_tokenizer(Path(path))
        return tokenizer

    def _ready(self, model: str, version: int, kind: str) -> TableEntry | None:
        """The version a call for (`model`, `version`) gets when the table has it READY as
        a `kind` model (version 0: the newest); None, and the engine answers why not."""
        found = [
            e
            for e in self.table.versions
            if e.name == model
            and e.kind == kind
            and e.state is ModelState.READY
            and (not version or e.version == version)
        ]
        return max(found, key=lambda e: e.version) if found else None

    def token_texts(self, model: str, version: int) -> Callable[[Sequence[int]], list[str]]:
        """As DataPlane.token_texts, with the tokenizer read here from the newest READY
        version's file (once per file)."""
        check_model(model)
        entry = self._ready(model, version, "generator")
        if entry is None:
            raise UnavailableError(f"model {model!r} has no READY generator version here")
        return functools.partial(each_token_text, self._tokenizer(entry.tokenizer_path))

    def check_prompt_size(
        self, model: str, version: int, prompt_bytes: int, token_ids: int, exact: bool = True
    ) -> None:
        """The table's admission check of a prompt's size, where the table has the model
        READY; otherwise the engine answers with the reason when the call reaches it."""
        self._check_serving()
        check_model(model)
        entry = self._ready(model, version, "generator")
        if entry is not None and entry.generator is not None:
            admit(GenerateFields(prompt_bytes, token_ids, exact), entry.generator)

    # From the table.

    def readiness(self) -> Readiness:
        if not self.serving:
            return Readiness(False, "the server is starting or draining")
        if self._link is None or not self.table.loaded:
            return Readiness(False, "the engine process is starting")
        return self.table.readiness

    def health(self, model: str = "") -> HealthReport:
        redact = functools.partial(redact_paths, root=Path(self.repository))
        serving = self.readiness().ready
        if model:
            check_model(model)
            entries = [e for e in self.table.versions if e.name == model]
            if not entries:
                known = sorted({e.name for e in self.table.versions if may_see(e.name)})
                raise NotFoundError(
                    f"model {model!r} not found; models: {', '.join(known) or 'none'}"
                )
        else:
            entries = [e for e in self.table.versions if may_see(e.name)]
        shown = [ModelHealth(e.name, e.version, e.state, redact(e.reason)) for e in entries]
        return HealthReport(serving, shown)

    def generator_models(self) -> list[str]:
        return sorted(
            {
                e.name
                for e in self.table.versions
                if e.kind == "generator" and e.state is ModelState.READY and may_see(e.name)
            }
        )

    def models_serving(self) -> list[tuple[str, bool]]:
        ready: dict[str, bool] = {}
        for e in self.table.versions:
            ready[e.name] = ready.get(e.name, False) or e.state is ModelState.READY
        return [(name, self.serving and ok) for name, ok in sorted(ready.items())]

    def has_model(self, name: str) -> bool:
        """Whether the engine serves a model of that name (metrics label known names)."""
        return any(e.name == name for e in self.table.versions)

    def model_counts(self) -> dict[str, int]:
        counts = {state.name.lower(): 0 for state in ModelState}
        for e in self.table.versions:
            counts[e.state.name.lower()] += 1
        return counts

    # The server's life.

    def apply(self, config: TensordConfig) -> None:
        self.ready_when = config.server.ready_when
        self.max_prompt_tokens = config.limits.max_prompt_tokens

    async def load_models(self) -> None:
        """Until the engine has loaded the repository (its table says so)."""
        await self._loaded.wait()

    async def reload_models(self, repository: Path) -> RepositoryChanges:
        """The engine reloads the models (the supervisor tells it); nothing here."""
        return RepositoryChanges()

    def fail_waiting_generations(self) -> None:
        """At a drain: the streams of this frontend that have no chunk yet end now."""
        error = UnavailableError(
            "the server is shutting down and this request had not started: "
            "retry on another instance"
        )
        for call_id, stream in list(self._streams.items()):
            if not stream.started:
                stream.put(error)
                self._abort(call_id)

    async def end_generations(self) -> None:
        error = UnavailableError(
            "the server is shutting down; the stream ended before it finished: retry on "
            "another instance"
        )
        for call_id, stream in list(self._streams.items()):
            stream.put(error)
            self._abort(call_id)

    def terminate_runs(self) -> None:
        """Runs belong to the engine: the supervisor drains it after the frontends."""

    async def close(self) -> None:
        self.detach("the server is shutting down")

    def _check_serving(self) -> None:
        if not self.serving:
            raise UnavailableError(NOT_SERVING)
