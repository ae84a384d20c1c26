"""The data plane: what each RPC does, in domain types. The servicer only converts.

The same data plane could serve another transport; nothing here knows protobuf.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import platform
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tensord import __version__
from tensord.access import check_model, may_see, redact_paths, sees_server_paths
from tensord.backends.base import DeviceOptions
from tensord.config import ReadyWhen, TensordConfig
from tensord.dataplane.admission import GenerateFields, GeneratorEntry, admit, text_bytes
from tensord.dataplane.chat import render_chat
from tensord.dataplane.snapshots import model_health, model_snapshot
from tensord.dataplane.types import (
    GenerateCall,
    HealthReport,
    ModelSnapshot,
    ModelTable,
    PredictCall,
    PredictResult,
    RequestOutput,
    ServerInfo,
    TableEntry,
)
from tensord.devices import probe_cpu, probe_gpus
from tensord.errors import (
    DeviceLostError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from tensord.eventloop import running_loop_name
from tensord.executor.split import run_splitting_on_oom
from tensord.generate.core.sampling_params import ResolvedSamplingParams
from tensord.generate.engine.engine import GenerationEngine
from tensord.generate.model.model_dir import (
    INLINE_TOKENIZE_CHARS,
    GeneratorDirectory,
    encode_text,
)
from tensord.observability.metrics import GenerationMetrics
from tensord.predict.validation import check_inputs, check_output_names
from tensord.registry.changes import RepositoryChanges
from tensord.registry.readiness import Readiness, judge
from tensord.registry.registry import BackendFactory, ModelRegistry, default_backend_factory
from tensord.registry.version import (
    GeneratorVersion,
    ModelState,
    PredictVersion,
    RequestStats,
)

NOT_SERVING = "the server is starting or draining; retry shortly"
"""What a call gets while the server does not serve (UNAVAILABLE: clients retry)."""


async def off_loop(text: str, encode: Callable[[str], list[int]]) -> list[int]:
    """`encode(text)`: where it is for a short text, on a worker thread for a long one
    (encode_text lets the GIL go meanwhile)."""
    if len(text) > INLINE_TOKENIZE_CHARS:
        return await asyncio.to_thread(encode, text)
    return encode(text)


async def _prompt_ids(call: GenerateCall, directory: GeneratorDirectory, version: int) -> list[int]:
    """The prompt as token ids: given, tokenised by a frontend with this version's
    tokenizer, or the text tokenised here (long texts on a worker thread); admission
    checks what it holds."""
    if call.prompt_token_ids or not call.prompt:
        return call.prompt_token_ids
    if call.tokenized is not None and call.tokenized_version == version:
        return call.tokenized
    return await off_loop(call.prompt, directory.encode_prompt)


def _rows(inputs: Mapping[str, np.ndarray]) -> int:
    """A batching model's request: its rows along dimension 0."""
    return next((int(a.shape[0]) for a in inputs.values() if a.ndim), 1)


def _count(stats: RequestStats, start: float, ok: bool) -> None:
    """One predict request ended, started at perf_counter() `start`."""
    elapsed = time.perf_counter() - start
    if ok:
        stats.succeeded += 1
        stats.succeeded_s += elapsed
    else:
        stats.failed += 1
        stats.failed_s += elapsed
    stats.last_ms = time.time_ns() // 1_000_000


def each_token_text(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token decoded alone, special tokens kept (how log probabilities show them)."""
    return tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)


class DataPlane:
    """Predict, Generate, Health and Info over a model registry."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.serving = False
        """True once the models are loaded, False again while draining: calls are taken."""
        self.ready_when: ReadyWhen = "any_model"
        """[server] ready_when: when health says SERVING while calls are taken."""
        self.max_prompt_tokens = 0
        """[limits] max_prompt_tokens: longer prompts get INVALID_ARGUMENT (0: no limit)."""
        self.generation_metrics: GenerationMetrics | None = None
        """Where Generate streams record tokens and latencies; None when metrics are off."""
        self.on_device_lost: Callable[[DeviceLostError], None] = lambda exc: None
        """Called when a run or a load meets a sticky device error (the server restarts)."""
        registry.on_device_lost = lambda exc: self.on_device_lost(exc)

    @classmethod
    def for_config(
        cls,
        config: TensordConfig,
        backend_factory: BackendFactory = default_backend_factory,
        on_change: Callable[[], None] | None = None,
    ) -> DataPlane:
        """A data plane over the configured model repository (nothing loaded yet);
        `on_change` is called whenever a version's state changes."""
        where = DeviceOptions(
            device_id=config.server.cuda_device, cache_directory=config.cache_directory
        )
        plane = cls(ModelRegistry(config.model_repository, backend_factory, on_change, where))
        plane.apply(config)
        return plane

    def apply(self, config: TensordConfig) -> None:
        """Take the settings a reload may change: readiness policy, prompt limit, symlinks."""
        self.ready_when = config.server.ready_when
        self.max_prompt_tokens = config.limits.max_prompt_tokens
        self.registry.follow_symlinks = config.follow_model_symlinks

    async def predict(self, call: PredictCall) -> PredictResult:
        """Validate against the signature, queue, run, and return the asked-for outputs."""
        self._check_serving()
        check_model(call.model)
        entry = self.registry.get(call.model, call.version, self._reasons())
        if not isinstance(entry, PredictVersion):
            raise FailedPreconditionError(
                f"model {entry.name!r} is a generator: call Generate, which streams its tokens "
                "(Predict runs predict models: tensors in, tensors out)"
            )
        if call.validated_version == entry.version:  # checked by a frontend process
            inputs, names = dict(call.inputs), call.output_names
        else:
            max_batch = entry.config.max_batch_size
            inputs = check_inputs(entry.name, entry.inputs, call.inputs, max_batch)
            names = check_output_names(entry.name, entry.outputs, call.output_names)
        executor = entry.executor
        if executor is None or entry.state is not ModelState.READY:  # unloaded between get and run
            raise UnavailableError(
                f"model {entry.name!r} version {entry.version} is {entry.state.name}"
            )
        rows = _rows(inputs) if entry.config.max_batch_size else 1
        start = time.perf_counter()
        # Counted from here, before the first await: a reload frees a swapped-out version
        # only after the requests it holds have finished.
        with entry.inflight:
            try:
                if entry.batcher is not None:
                    result = await entry.batcher.submit(inputs, names, call.deadline)
                elif entry.config.max_batch_size:
                    result = await run_splitting_on_oom(
                        executor.run, [inputs], names, call.deadline
                    )
                else:  # dimension 0 is not a batch: its rows may not be run apart
                    result = await executor.run([inputs], names, call.deadline)
            except BaseException as exc:
                _count(entry.requests, start, ok=False)
                if isinstance(exc, DeviceLostError):
                    self.on_device_lost(exc)
                raise
        stats = entry.requests
        _count(stats, start, ok=True)
        stats.rows += rows
        stats.queue_s += result.queue_s
        stats.compute_s += result.compute_s
        return PredictResult(
            entry.name,
            entry.version,
            list(zip(names, result.outputs, strict=True)),
            result.queue_s,
            result.compute_s,
        )

    async def generate(self, call: GenerateCall) -> AsyncGenerator[RequestOutput, None]:
        """Check the request, admit it to the model's engine and stream its chunks."""
        self._check_serving()
        entry, engine = self._generator(call.model, call.version)
        # Counted before the first await (tokenising a long prompt goes to a thread): a
        # reload frees a swapped-out version only once the calls holding it have ended.
        with entry.inflight:
            # By size first: a prompt certainly too long is never tokenised, nor its ids
            # looked at one by one.
            self._admit(
                GenerateFields(text_bytes(call.prompt), len(call.prompt_token_ids)),
                entry.name,
                engine,
            )
            ids = await _prompt_ids(call, engine.directory, entry.version)
            fields = GenerateFields(
                token_ids=len(call.prompt_token_ids),
                prompt_token_ids=ids,
                text=bool(call.prompt),
                sampling=call.sampling,
            )
            params = self._admit(fields, entry.name, engine)
            assert params is not None  # a parsed request resolves its sampling parameters
            metrics = self.generation_metrics
            recorder = metrics.stream(entry.name, len(ids)) if metrics else None
            arrival = call.arrival or None
            try:
                async for chunk in engine.generate(ids, params, call.deadline, arrival):
                    if recorder is not None:
                        recorder.tokens(len(chunk.token_ids))
                    yield chunk
            except DeviceLostError as exc:
                self.on_device_lost(exc)
                raise

    async def chat_prompt(
        self, model: str, version: int, messages: list[dict[str, Any]]
    ) -> list[int]:
        """A conversation as prompt token ids, rendered with the model's chat template
        (with the generation prompt) and tokenised as transformers' apply_chat_template
        does: INVALID_ARGUMENT for a model without a template, and the errors of Generate
        for a model the caller may not use or that does not serve."""
        self._check_serving()
        entry, engine = self._generator(model, version)
        directory = engine.directory
        template = directory.spec.chat_template
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
        self._admit(GenerateFields(prompt_bytes=size), entry.name, engine)  # before tokenising
        return await off_loop(text, functools.partial(encode_text, directory.tokenizer))

    def token_texts(self, model: str, version: int) -> Callable[[Sequence[int]], list[str]]:
        """How each token of the version a Generate call would use reads on its own (for
        showing log probabilities): its tokenizer decoding one token at a time, special
        tokens kept. Taken with no await before the call, it is the same version's."""
        _, engine = self._generator(model, version)
        return functools.partial(each_token_text, engine.directory.tokenizer)

    def _generator(self, model: str, version: int) -> tuple[GeneratorVersion, GenerationEngine]:
        """The version a Generate call names and its engine: PERMISSION_DENIED, NOT_FOUND,
        UNAVAILABLE (loading), or FAILED_PRECONDITION (failed to load, or a predict
        model)."""
        check_model(model)
        entry = self.registry.get(model, version, self._reasons())
        if not isinstance(entry, GeneratorVersion):
            raise FailedPreconditionError(
                f"model {entry.name!r} is a predict model (tensors in, tensors out), not a "
                "generator: call Predict, or Generate on a generator model (Info lists each "
                "model's kind)"
            )
        engine = entry.engine
        if engine is None:  # freed between get and here
            raise UnavailableError(
                f"model {entry.name!r} version {entry.version} is {entry.state.name}"
            )
        metrics = self.generation_metrics
        if metrics is not None and engine.output_processor.timings is None:
            engine.output_processor.timings = metrics.timings(entry.name)
        return entry, engine

    def check_prompt_size(
        self, model: str, version: int, prompt_bytes: int, token_ids: int, exact: bool = True
    ) -> None:
        """Before a Generate request is parsed: the model it names serves Generate (else the
        error generate() would give), and INVALID_ARGUMENT when its prompt certainly has
        more tokens than the model admits (token ids counted, or at least `token_ids` when
        not `exact`; a text of more bytes than that many of the vocabulary's longest
        tokens), so it is never tokenised or converted."""
        self._check_serving()
        entry, engine = self._generator(model, version)
        self._admit(GenerateFields(prompt_bytes, token_ids, exact), entry.name, engine)

    def _admit(
        self, fields: GenerateFields, name: str, engine: GenerationEngine
    ) -> ResolvedSamplingParams | None:
        """The one admission step (admission.py), against the generator's table entry."""
        return admit(fields, self._generator_entry(name, engine))

    def _generator_entry(self, name: str, engine: GenerationEngine) -> GeneratorEntry:
        spec = engine.directory.spec
        return GeneratorEntry(
            name=name,
            max_model_len=engine.limits.max_model_len,
            vocab_size=spec.vocab_size,
            max_token_bytes=engine.directory.max_token_bytes,
            defaults=engine.defaults,
            max_prompt_tokens=self.max_prompt_tokens,
        )

    def table(self, loaded: bool) -> ModelTable:
        """The model table a frontend process serves from: every version's state, the
        readiness policy's verdict, each READY generator's admission row; `loaded` once the
        repository was loaded."""
        entries = []
        for mv in self.registry.versions():
            generator, tokenizer = None, ""
            prefix: tuple[int, ...] = ()
            if isinstance(mv, GeneratorVersion) and mv.engine is not None:
                generator = self._generator_entry(mv.name, mv.engine)
                spec = mv.engine.directory.spec
                tokenizer = str(spec.tokenizer_path)
                if spec.add_bos_token and spec.bos_token_id is not None:
                    prefix = (spec.bos_token_id,)
            entry = TableEntry(
                mv.name, mv.version, mv.state, mv.reason, mv.kind, generator, tokenizer, prefix
            )
            if isinstance(mv, PredictVersion) and mv.state is ModelState.READY:
                entry = dataclasses.replace(
                    entry,
                    inputs=tuple(mv.inputs),
                    outputs=tuple(mv.outputs),
                    max_batch_size=mv.config.max_batch_size,
                )
            entries.append(entry)
        verdict = judge(self.ready_when, self.registry.versions())
        return ModelTable(loaded, verdict, tuple(entries))

    def readiness(self) -> Readiness:
        """Whether health says SERVING: calls are taken and the readiness policy
        ([server] ready_when) is met by the models' states; if not, why."""
        if not self.serving:
            return Readiness(False, "the server is starting or draining")
        return judge(self.ready_when, self.registry.versions())

    def health(self, model: str = "") -> HealthReport:
        """Serving state and every version the caller may use, or one model's versions
        (NOT_FOUND if unknown); failure reasons without server paths."""
        redact = functools.partial(redact_paths, root=self.registry.repository)
        serving = self.readiness().ready
        if model:
            check_model(model)  # a token sees the health of the models it may use
            versions = self.registry.get_versions(model)
        else:
            versions = [mv for mv in self.registry.versions() if may_see(mv.name)]
        return HealthReport(serving, [model_health(mv, redact) for mv in versions])

    def generator_models(self) -> list[str]:
        """The generator models the current caller may use that have a READY version, by
        name (the OpenAI API's model list)."""
        names = {
            mv.name
            for mv in self.registry.versions()
            if isinstance(mv, GeneratorVersion)
            and mv.state is ModelState.READY
            and may_see(mv.name)
        }
        return sorted(names)

    def models_serving(self) -> list[tuple[str, bool]]:
        """Each model's name and whether it serves: calls are taken and one of its
        versions is READY (the per-model health services)."""
        serving = []
        for name in self.registry.names():
            try:
                versions = self.registry.get_versions(name)
            except NotFoundError:  # removed by a reload while this ran
                versions = []
            ready = any(mv.state is ModelState.READY for mv in versions)
            serving.append((name, self.serving and ready))
        return serving

    def has_model(self, name: str) -> bool:
        """Whether the repository has a model of that name (metrics label known names)."""
        return name in self.registry.names()

    def model_counts(self) -> dict[str, int]:
        """Model versions by state: {"loading": 0, "ready": 2, "failed": 1, "unloading": 0}."""
        counts = {state.name.lower(): 0 for state in ModelState}
        for mv in self.registry.versions():
            counts[mv.state.name.lower()] += 1
        return counts

    def _reasons(self) -> Callable[[str], str]:
        """How a failure reason is shown to the current caller: whole to an operator
        (authentication off, or a token allowed every model), else without server paths."""
        if sees_server_paths():
            return str
        return functools.partial(redact_paths, root=self.registry.repository)

    async def info(self) -> ServerInfo:
        """The server, its devices and providers, and every model version the caller may
        use (server paths in failure reasons only for an operator: authentication off, or a
        token allowed every model)."""
        import grpc
        import onnxruntime
        from google.protobuf import __version__ as protobuf_version

        from tensord.backends.onnxruntime import available_providers
        from tensord.backends.tensorrt import tensorrt_status

        runtime = {
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__,
            "grpcio": grpc.__version__,
            "protobuf": protobuf_version,
            "numpy": np.__version__,
            "event_loop": running_loop_name(),
        }
        return ServerInfo(
            __version__,
            runtime,
            probe_cpu(),
            probe_gpus(),
            available_providers(),
            tensorrt_status()[1],
            await self.model_snapshots(),
        )

    async def model_snapshots(self, model: str = "") -> list[ModelSnapshot]:
        """Every version of `model` as Info shows them (PERMISSION_DENIED when the caller may
        not use it, NOT_FOUND when unknown), or of every model the caller may use; no
        device probes, so cheap enough for every metadata call."""
        redact = self._reasons()
        if model:
            check_model(model)
            versions = self.registry.get_versions(model)
        else:
            versions = [mv for mv in self.registry.versions() if may_see(mv.name)]
        return [model_snapshot(mv, redact) for mv in versions]

    async def load_models(self) -> None:
        """Scan the repository and load every version (start-up)."""
        await self.registry.load_all()

    async def reload_models(self, repository: Path) -> RepositoryChanges:
        """Scan `repository` again: load new and changed versions, unload removed ones."""
        return await self.registry.reload(repository)

    def fail_waiting_generations(self) -> None:
        """At a drain: end the Generate requests that have not started with UNAVAILABLE,
        so that their clients retry elsewhere at once."""
        error = UnavailableError(
            "the server is shutting down and this request had not started: "
            "retry on another instance"
        )
        for engine in self._engines():
            engine.fail_waiting(error)

    async def end_generations(self) -> None:
        """Shortly before a drain's grace ends: close the Generate streams still running
        with UNAVAILABLE (their blocks freed), so clients see a status to retry on."""
        error = UnavailableError(
            "the server is shutting down; the stream ended before it finished: retry on "
            "another instance"
        )
        for engine in self._engines():
            await asyncio.to_thread(engine.close, error)

    def _engines(self) -> list[GenerationEngine]:
        return [
            mv.engine
            for mv in self.registry.versions()
            if isinstance(mv, GeneratorVersion) and mv.engine is not None
        ]

    def terminate_runs(self) -> None:
        """Cut every model run in progress short (the drain's grace has run out)."""
        self.registry.terminate_runs()

    async def close(self) -> None:
        """Unload every version and free what it holds."""
        await self.registry.close()

    def _check_serving(self) -> None:
        if not self.serving:
            raise UnavailableError(NOT_SERVING)
