"""The data plane: what each RPC does, in domain types. The servicers only convert.

One data plane serves every protocol in both process modes, over an engine client
(engine_client.py): the models in this process (LocalEngine), or the engine process over
the rings (tensord.procs.remote). Here, in whichever process takes the call: serving
state, authorisation, the version a call goes to (from the model table the engine
publishes), Predict's checks against the signature, Generate's admission, tokenising,
chat rendering, detokenising, stop strings and each stream's output slot, health and
readiness. Nothing here knows protobuf.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tensord.access import check_model, may_see, redact_paths, sees_server_paths
from tensord.config import ReadyWhen, TensordConfig
from tensord.dataplane.admission import GenerateFields, GeneratorEntry, admit, text_bytes
from tensord.dataplane.chat import render_chat
from tensord.dataplane.control import ModelControl
from tensord.dataplane.embedding import cut_dimensions, texts_of, tokens_for
from tensord.dataplane.engine_client import EngineClient
from tensord.dataplane.kinds import EMBEDDING, GENERATOR, PREDICT, Kind, check_kind
from tensord.dataplane.types import (
    EmbedCall,
    EmbedResult,
    EngineCoreRequest,
    GenerateCall,
    HealthReport,
    ModelHealth,
    ModelSnapshot,
    ModelState,
    PredictCall,
    PredictResult,
    Readiness,
    RequestOutput,
    ServerInfo,
    TableEntry,
)
from tensord.errors import InvalidArgumentError, UnavailableError
from tensord.generate.engine.output_processor import TokenTimings
from tensord.generate.engine.streams import OutputStreams
from tensord.generate.model.model_dir import INLINE_TOKENIZE_CHARS, encode_text
from tensord.observability.metrics import GenerationMetrics
from tensord.predict.validation import check_inputs, check_output_names
from tensord.registry.changes import RepositoryChanges

NOT_SERVING = "the server is starting or draining; retry shortly"
"""What a call gets while the server does not serve (UNAVAILABLE: clients retry)."""


async def off_loop(text: str, encode: Callable[[str], list[int]]) -> list[int]:
    """`encode(text)`: where it is for a short text, on a worker thread for a long one
    (encode_text lets the GIL go meanwhile)."""
    if len(text) > INLINE_TOKENIZE_CHARS:
        return await asyncio.to_thread(encode, text)
    return encode(text)


def each_token_text(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token decoded alone, special tokens kept (how log probabilities show them)."""
    return tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)


class DataPlane:
    """Predict, Generate, Health and Info over an engine client."""

    def __init__(self, engine: EngineClient, config: TensordConfig) -> None:
        self.engine = engine
        self.repository = config.model_repository
        """The model repository's root: failure reasons are shown without it."""
        self.ready_when: ReadyWhen = config.server.ready_when
        """[server] ready_when (the engine's table judges by it; logs name it)."""
        self.serving = False
        """True once the models are loaded, False again while draining: calls are taken."""
        self.generation_metrics: GenerationMetrics | None = None
        """Where Generate streams record tokens and latencies; None when metrics are off."""
        self.on_models_changed: Callable[[], None] = lambda: None
        """Called when the model table changes (the server re-publishes health)."""
        engine.on_table = lambda: self.on_models_changed()
        self.control = ModelControl(engine, self._shown_reason)
        """Loading and unloading models on request (model_control = "explicit")."""
        self.streams = OutputStreams(engine.stop_generations, engine.abort_generation)
        """Every Generate stream of this process, fed by the engine's outputs."""
        self._timings: dict[str, TokenTimings] = {}

    # -- which version a call goes to --------------------------------------------------

    def lookup(self, model: str, version: int, kind: Kind, authorised: bool = False) -> TableEntry:
        """The READY version a `kind` call for (`model`, `version`) goes to: UNAVAILABLE
        while the server does not serve, PERMISSION_DENIED (unless `authorised` already),
        NOT_FOUND, UNAVAILABLE (loading), FAILED_PRECONDITION (failed to load, or the
        other kind of model)."""
        if not self.serving:
            raise UnavailableError(NOT_SERVING)
        if not authorised or not model:  # an intake that read no name authorised none
            check_model(model)
        entry = self.engine.table.find(model, version, self._shown_reason)
        check_kind(entry, kind)
        return entry

    def _still_ready(self, entry: TableEntry, asked: int, kind: Kind) -> TableEntry:
        """After an await: `entry`'s version as the table has it now (replaced in place by
        a reload: the new load), or the version the call goes to now that a reload has
        swapped it out."""
        same = self.engine.table.by_name.get(entry.name, {}).get(entry.version)
        if same is not None and same.state is ModelState.READY:
            return same
        return self.lookup(entry.name, asked, kind, authorised=True)

    # -- Predict -----------------------------------------------------------------------

    async def predict(self, call: PredictCall, entry: TableEntry | None = None) -> PredictResult:
        """Check against the signature of the version that serves, then run it."""
        if entry is None:
            entry = self.lookup(call.model, call.version, PREDICT)
        else:  # looked up before the request was parsed
            entry = self._still_ready(entry, call.version, PREDICT)
        inputs = check_inputs(entry.name, entry.inputs, call.inputs, entry.max_batch_size)
        names = check_output_names(entry.name, entry.outputs, call.output_names)
        if entry.embedding is not None:
            return await self._predict_embedding(entry, call, inputs, names)
        checked = PredictCall(entry.name, entry.version, list(inputs.items()), names, call.deadline)
        return await self.engine.predict(checked)

    async def _predict_embedding(
        self, entry: TableEntry, call: PredictCall, inputs: dict[str, Any], names: list[str]
    ) -> PredictResult:
        """Predict on an embedding model: its one input's texts (BYTES, UTF-8) embedded."""
        (texts,) = inputs.values()
        embed = EmbedCall(entry.name, entry.version, texts_of(texts), [], deadline=call.deadline)
        result = await self.embed(embed, entry)
        outputs = [(name, result.vectors) for name in names]
        return PredictResult(
            result.model, result.version, outputs, result.queue_s, result.compute_s
        )

    # -- Embed -------------------------------------------------------------------------

    async def embed(self, call: EmbedCall, entry: TableEntry | None = None) -> EmbedResult:
        """Texts (or token ids) to one vector each: checked and tokenised here, run by the
        engine on the version that serves, cut to the dimensions asked for."""
        if entry is None:
            entry = self.lookup(call.model, call.version, EMBEDDING)
        else:
            entry = self._still_ready(entry, call.version, EMBEDDING)
        tokens = await tokens_for(call, entry, self.engine.tokenizer)
        # A reload may have swapped the version out meanwhile: tokenise for the new one.
        fresh = self._still_ready(entry, call.version, EMBEDDING)
        if fresh.serial != entry.serial:
            tokens = await tokens_for(call, fresh, self.engine.tokenizer)
        result = await self.engine.embed(tokens)
        normalized = fresh.embedding is not None and fresh.embedding.normalized
        result.vectors = cut_dimensions(result.vectors, call.dimensions, normalized)
        return result

    # -- Generate ----------------------------------------------------------------------

    def check_prompt_size(
        self, entry: TableEntry, prompt_bytes: int, token_ids: int, exact: bool = True
    ) -> None:
        """Before a Generate request is parsed: INVALID_ARGUMENT when its prompt certainly
        has more tokens than the model admits (token ids counted, or at least `token_ids`
        when not `exact`; a text of more bytes than that many of the vocabulary's longest
        tokens), so it is never tokenised or converted."""
        admit(GenerateFields(prompt_bytes, token_ids, exact), _row(entry))

    async def chat_prompt(self, entry: TableEntry, messages: list[dict[str, Any]]) -> list[int]:
        """A conversation as prompt token ids, rendered with the model's chat template
        (with the generation prompt) and tokenised as transformers' apply_chat_template
        does: INVALID_ARGUMENT for a model without a template."""
        template = entry.chat_template
        if template is None:
            raise InvalidArgumentError(
                f"model {entry.name!r} has no chat template (tokenizer_config.json sets no "
                "chat_template): use the completions API with a prompt"
            )
        render = functools.partial(render_chat, template, messages, add_generation_prompt=True)
        # Jinja is Python: on a worker thread a large conversation's rendering gives the
        # event loop its turns (the GIL switches between them) instead of holding it.
        large = len(messages) > 64 or sum(len(m.get("content") or "") for m in messages) > (
            INLINE_TOKENIZE_CHARS
        )
        text = await asyncio.to_thread(render) if large else render()
        size = text_bytes(text, "the conversation")
        admit(GenerateFields(prompt_bytes=size), _row(entry))  # before tokenising
        tokenizer = self.engine.tokenizer(entry)
        return await off_loop(text, functools.partial(encode_text, tokenizer))

    def token_texts(self, entry: TableEntry) -> Callable[[Sequence[int]], list[str]]:
        """How each token of `entry`'s version reads on its own (for showing log
        probabilities): its tokenizer decoding one token at a time, special tokens kept."""
        return functools.partial(each_token_text, self.engine.tokenizer(entry))

    async def generate(
        self, call: GenerateCall, entry: TableEntry | None = None
    ) -> AsyncGenerator[RequestOutput, None]:
        """Admit the request (every refusal before the first chunk), hand it to the
        engine, and stream its chunks: text, stop strings and usage made here."""
        if entry is None:
            entry = self.lookup(call.model, call.version, GENERATOR)
        else:  # looked up before the request was parsed
            entry = self._still_ready(entry, call.version, GENERATOR)
        # By size first: a prompt certainly too long is never tokenised, nor its ids
        # looked at one by one.
        admit(GenerateFields(text_bytes(call.prompt), len(call.prompt_token_ids)), _row(entry))
        ids = call.prompt_token_ids
        text = bool(call.prompt) and not ids
        tokenizer = self.engine.tokenizer(entry)
        if text:
            ids = await self._tokenise(tokenizer, entry, call.prompt)
        # The version may have been swapped out by a reload since it was looked up (an
        # await, here or before the call came): the call goes to the one that serves now,
        # tokenised again when that is another load (perhaps another tokenizer).
        fresh = self._still_ready(entry, call.version, GENERATOR)
        if fresh.serial != entry.serial:
            tokenizer = self.engine.tokenizer(fresh)
            if text:
                ids = await self._tokenise(tokenizer, fresh, call.prompt)
        entry = fresh
        fields = GenerateFields(
            token_ids=len(call.prompt_token_ids),
            prompt_token_ids=ids,
            text=bool(call.prompt),
            sampling=call.sampling,
        )
        params = admit(fields, _row(entry))
        assert params is not None  # a parsed request resolves its sampling parameters
        arrival = call.arrival or time.monotonic()
        request = EngineCoreRequest(
            entry.name, entry.version, ids, params, call.deadline, arrival, call.priority
        )
        # No await from here until the stream is open: the engine's outputs reach the
        # streams on a later turn of the loop.
        request_id = self.engine.add_generation(request, self.streams)
        timings = self._timings_of(entry.name)
        collector = self.streams.open(request_id, tokenizer, ids, params, arrival, timings)
        metrics = self.generation_metrics
        recorder = metrics.stream(entry.name, len(ids)) if metrics else None
        chunks = self.streams.stream(request_id, collector)
        try:
            async for chunk in chunks:
                if recorder is not None:
                    recorder.tokens(len(chunk.token_ids))
                yield chunk
        finally:
            await chunks.aclose()  # a reader gone before the end aborts the request now

    async def _tokenise(self, tokenizer: Tokenizer, entry: TableEntry, text: str) -> list[int]:
        """A text prompt's ids with `entry`'s tokenizer: the version's prefix (its BOS),
        then the text's (a long text on a worker thread)."""
        ids = await off_loop(text, functools.partial(encode_text, tokenizer))
        return [*entry.prompt_prefix, *ids] if entry.prompt_prefix else ids

    def _timings_of(self, model: str) -> TokenTimings | None:
        metrics = self.generation_metrics
        if metrics is None:
            return None
        timings = self._timings.get(model)
        if timings is None:
            timings = self._timings[model] = metrics.timings(model)
        return timings

    # -- health and info ---------------------------------------------------------------

    def readiness(self) -> Readiness:
        """Whether health says SERVING: calls are taken and the readiness policy
        ([server] ready_when) is met by the models' states; if not, why."""
        if not self.serving:
            return Readiness(False, "the server is starting or draining")
        return self.engine.table.readiness

    def health(self, model: str = "") -> HealthReport:
        """Serving state and every version the caller may use, or one model's versions
        (NOT_FOUND if unknown); failure reasons without server paths."""
        redact = functools.partial(redact_paths, root=self.repository)
        serving = self.readiness().ready
        table = self.engine.table
        if model:
            check_model(model)  # a token sees the health of the models it may use
            entries = table.named(model)
        else:
            entries = [e for e in table.versions if may_see(e.name)]
        shown = [ModelHealth(e.name, e.version, e.state, redact(e.reason)) for e in entries]
        return HealthReport(serving, shown)

    def openai_models(self) -> list[str]:
        """The generator and embedding models the current caller may use that have a READY
        version, by name (the OpenAI API's model list)."""
        names = {
            e.name
            for e in self.engine.table.versions
            if e.kind in (GENERATOR, EMBEDDING) and e.state is ModelState.READY and may_see(e.name)
        }
        return sorted(names)

    def models_serving(self) -> list[tuple[str, bool]]:
        """Each model's name and whether it serves: calls are taken and one of its
        versions is READY (the per-model health services)."""
        ready: dict[str, bool] = {}
        for e in self.engine.table.versions:
            ready[e.name] = ready.get(e.name, False) or e.state is ModelState.READY
        return [(name, self.serving and ok) for name, ok in sorted(ready.items())]

    def has_model(self, name: str) -> bool:
        """Whether the repository has a model of that name (metrics label known names)."""
        return name in self.engine.table.by_name

    def model_counts(self) -> dict[str, int]:
        """Model versions by state: {"loading": 0, "ready": 2, "failed": 1, "unloading": 0}."""
        return self.engine.table.counts()

    def _shown_reason(self, reason: str) -> str:
        """A failure reason as the current caller sees it: whole for an operator
        (authentication off, or a token allowed every model), else without server paths."""
        return reason if sees_server_paths() else redact_paths(reason, self.repository)

    async def info(self) -> ServerInfo:
        """The server, its devices and providers, and every model version the caller may
        use (server paths in failure reasons only for an operator)."""
        info = await self.engine.info()
        return dataclasses.replace(info, models=self._shown(info.models))

    async def model_snapshots(self, model: str = "") -> list[ModelSnapshot]:
        """Every version of `model` as Info shows them (PERMISSION_DENIED when the caller may
        not use it, NOT_FOUND when unknown), or of every model the caller may use."""
        if model:
            check_model(model)
            self.engine.table.named(model)  # NOT_FOUND, listing what this caller may see
        snapshots = self._shown(await self.engine.snapshots(model))
        if model and not snapshots:  # removed by a reload meanwhile
            self.engine.table.named(model)
            raise UnavailableError(f"model {model!r} is being removed")
        return snapshots

    def _shown(self, snapshots: list[ModelSnapshot]) -> list[ModelSnapshot]:
        """The snapshots the caller may see, reasons redacted for it."""
        redact = self._shown_reason
        return [
            dataclasses.replace(s, reason=redact(s.reason)) if s.reason else s
            for s in snapshots
            if may_see(s.name)
        ]

    # -- the server's life -------------------------------------------------------------

    def apply(self, config: TensordConfig) -> None:
        """Take the settings a reload may change (the engine in this process too)."""
        self.ready_when = config.server.ready_when
        self.engine.apply(config)

    async def load_models(self) -> None:
        """Until every model of the repository has loaded or failed once."""
        await self.engine.load_models()

    async def reload_models(self, repository: Path) -> RepositoryChanges:
        """Scan `repository` again: load new and changed versions, unload removed ones."""
        self.repository = repository
        return await self.engine.reload_models(repository)

    def fail_waiting_generations(self) -> None:
        """At a drain: end the Generate streams that have had no token yet with
        UNAVAILABLE, so that their clients retry elsewhere at once."""
        error = UnavailableError(
            "the server is shutting down and this request had not started: "
            "retry on another instance"
        )
        self.streams.end(self.streams.unstarted(), error)

    async def end_generations(self) -> None:
        """Shortly before a drain's grace ends: close the Generate streams still running
        with UNAVAILABLE (their KV cache freed), so clients see a status to retry on."""
        error = UnavailableError(
            "the server is shutting down; the stream ended before it finished: retry on "
            "another instance"
        )
        self.streams.end(self.streams.open_ids(), error)

    def terminate_runs(self) -> None:
        """Cut every model run in progress short (the drain's grace has run out)."""
        self.engine.terminate_runs()

    async def close(self) -> None:
        """Unload every version and free what it holds (or let go of the engine)."""
        await self.engine.close()


def _row(entry: TableEntry) -> GeneratorEntry:
    """A READY generator version's admission row."""
    if entry.generator is None:  # the table lists a generator's row once it is READY
        raise UnavailableError(f"model {entry.name!r} version {entry.version} is not ready")
    return entry.generator
