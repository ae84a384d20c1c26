"""The engine in this process: the model registry, its batchers, executors and generation
engines, behind the EngineClient interface.

The one-process daemon's data plane drives it directly; in the engine process it serves
every frontend's link (tensord.procs.engine). It runs what it is handed for the exact
version named: the checks, the tokenising and the text are the data plane's. A version
swapped out by a reload still serves the calls that reach it before it is freed (it is
freed once the calls it holds end); a call for a version already freed gets UNAVAILABLE,
which clients retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tensord import __version__
from tensord.backends.base import DeviceOptions
from tensord.config import ReadyWhen, TensordConfig
from tensord.dataplane.admission import GeneratorEntry
from tensord.dataplane.embedding import embedding_row
from tensord.dataplane.snapshots import model_snapshot
from tensord.dataplane.types import (
    EmbedResult,
    EmbedTokens,
    EngineCoreRequest,
    ModelSnapshot,
    ModelTable,
    PredictCall,
    PredictResult,
    Readiness,
    ServerInfo,
    TableEntry,
)
from tensord.devices import probe_cpu, probe_gpus
from tensord.embedding.loader import embed_each
from tensord.errors import DeviceLostError, NotFoundError, UnavailableError
from tensord.eventloop import running_loop_name
from tensord.executor.base import RunResult
from tensord.executor.split import run_splitting_on_oom
from tensord.generate.engine.engine import GenerationEngine
from tensord.generate.engine.streams import OutputSink
from tensord.registry.changes import RepositoryChanges
from tensord.registry.readiness import judge
from tensord.registry.registry import BackendFactory, ModelRegistry, default_backend_factory
from tensord.registry.version import (
    EmbeddingVersion,
    GeneratorVersion,
    ModelState,
    ModelVersion,
    PredictVersion,
    RequestStats,
)


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


def _succeeded(stats: RequestStats, start: float, rows: int, result: RunResult) -> None:
    """A predict (or embed) request ran: its rows and where its time went."""
    _count(stats, start, ok=True)
    stats.rows += rows
    stats.queue_s += result.queue_s
    stats.compute_s += result.compute_s


class LocalEngine:
    """The models of one repository, run in this process."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.ready_when: ReadyWhen = "any_model"
        """[server] ready_when: the readiness policy the table's verdict follows."""
        self.max_prompt_tokens = 0
        """[limits] max_prompt_tokens, in each generator's admission row."""
        self.loaded = False
        """Every model of the repository has loaded or failed once."""
        self.on_table: Callable[[], None] = lambda: None
        self.on_device_lost: Callable[[DeviceLostError], None] = lambda exc: None
        registry.on_device_lost = lambda exc: self.on_device_lost(exc)
        self.control = registry
        self._table = ModelTable(False, Readiness(False, "the models are loading"))
        self._generations: dict[str, GenerationEngine] = {}
        """Each live request's engine, by request id."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop the generations run on (an engine thread's errors go there)."""

    @classmethod
    def for_config(
        cls,
        config: TensordConfig,
        backend_factory: BackendFactory = default_backend_factory,
    ) -> LocalEngine:
        """An engine over the configured model repository (nothing loaded yet)."""
        where = DeviceOptions(
            device_id=config.server.cuda_device, cache_directory=config.cache_directory
        )
        engine: LocalEngine
        registry = ModelRegistry(
            config.model_repository, backend_factory, lambda: engine.models_changed(), where
        )
        registry.set_model_control(config.server.model_control, config.server.load_models)
        engine = cls(registry)
        engine.apply(config)
        return engine

    @property
    def table(self) -> ModelTable:
        return self._table

    def models_changed(self) -> None:
        """A version's state changed: the table follows at once (calls in this process
        see it before their next await)."""
        self._table = self._build_table()
        self.on_table()

    def apply(self, config: TensordConfig) -> None:
        self.ready_when = config.server.ready_when
        self.max_prompt_tokens = config.limits.max_prompt_tokens
        self.registry.follow_symlinks = config.follow_model_symlinks
        self.models_changed()

    def has_model(self, name: str) -> bool:
        """Whether the repository has a model of that name (metrics label known names)."""
        return name in self._table.by_name

    # -- calls -------------------------------------------------------------------------

    def _serving(self, name: str, version: int, kind: type[ModelVersion]) -> ModelVersion:
        """The version a checked call named, while it still serves: READY, or swapped out
        by a reload and not yet freed (its calls in flight end first)."""
        mv = self.registry.version(name, version)
        if isinstance(mv, kind):
            held = mv.engine if isinstance(mv, GeneratorVersion) else mv.executor
            if mv.state is ModelState.READY or (
                mv.state is ModelState.UNLOADING and held is not None
            ):
                return mv
        if mv is None:
            state = "no longer served"
        elif not isinstance(mv, kind):
            state = f"now a {mv.kind} model (reloaded)"
        else:
            state = mv.state.name
        raise UnavailableError(f"model {name!r} version {version} is {state}; retry shortly")

    async def predict(self, call: PredictCall) -> PredictResult:
        entry = self._serving(call.model, call.version, PredictVersion)
        assert isinstance(entry, PredictVersion)
        inputs = dict(call.inputs)
        names = call.output_names
        rows = _rows(inputs) if entry.config.max_batch_size else 1
        start = time.perf_counter()
        # Counted from here, before the first await: a reload frees a swapped-out version
        # only after the requests it holds have finished.
        with entry.inflight:
            executor = entry.executor
            if executor is None:  # freed between the check and here: never, but typed
                raise UnavailableError(f"model {entry.name!r} version {entry.version} is freed")
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
                self._failed(entry, start, exc)
                raise
        _succeeded(entry.requests, start, rows, result)
        return PredictResult(
            entry.name,
            entry.version,
            list(zip(names, result.outputs, strict=True)),
            result.queue_s,
            result.compute_s,
        )

    def add_generation(
        self,
        request: EngineCoreRequest,
        sink: OutputSink,
        on_end: Callable[[], None] | None = None,
    ) -> str:
        """As EngineClient.add_generation; `on_end` is called once the request has ended."""
        entry = self._serving(request.model, request.version, GeneratorVersion)
        assert isinstance(entry, GeneratorVersion) and entry.engine is not None
        engine = entry.engine
        if engine.on_device_lost != self._lost_in_step:
            self._loop = asyncio.get_running_loop()
            engine.on_device_lost = self._lost_in_step
        # Counted until the request ends: a reload frees a swapped-out version only once
        # the streams it holds have ended.
        counter = entry.inflight.__enter__()
        request_id = ""

        def ended() -> None:
            counter.__exit__(None, None, None)
            self._generations.pop(request_id, None)
            if on_end is not None:
                on_end()

        try:
            request_id = engine.add_request(
                request.prompt_token_ids,
                request.params,
                request.deadline,
                request.arrival,
                sink,
                ended,
                priority=request.priority,
            )
        except BaseException:
            counter.__exit__(None, None, None)
            raise
        self._generations[request_id] = engine
        return request_id

    def _lost_in_step(self, exc: DeviceLostError) -> None:
        """An engine thread's step met a sticky device error: tell the loop."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                self._loop.call_soon_threadsafe(self.on_device_lost, exc)

    def abort_generation(self, request_id: str) -> None:
        engine = self._generations.get(request_id)
        if engine is not None:
            engine.abort(request_id)

    def stop_generations(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            engine = self._generations.get(request_id)
            if engine is not None:
                engine.stop([request_id])

    def tokenizer(self, entry: TableEntry) -> Tokenizer:
        if entry.embedding is not None:
            emb = self._serving(entry.name, entry.version, EmbeddingVersion)
            assert isinstance(emb, EmbeddingVersion) and emb.spec is not None
            assert emb.spec.tokenizer is not None
            return emb.spec.tokenizer
        mv = self._serving(entry.name, entry.version, GeneratorVersion)
        assert isinstance(mv, GeneratorVersion) and mv.engine is not None
        return mv.engine.directory.tokenizer

    async def embed(self, call: EmbedTokens) -> EmbedResult:
        """Each text's ids as one request of the version's batcher, which packs texts by
        length into runs; the vectors in the texts' order."""
        entry = self._serving(call.model, call.version, EmbeddingVersion)
        assert isinstance(entry, EmbeddingVersion) and entry.spec is not None
        start = time.perf_counter()
        with entry.inflight:
            batcher = entry.batcher
            if batcher is None:  # freed between the check and here: never, but typed
                raise UnavailableError(f"model {entry.name!r} version {entry.version} is freed")
            try:
                results = await embed_each(
                    batcher, entry.spec, entry.token_inputs, call.token_ids, call.lengths,
                    call.deadline,
                )  # fmt: skip
            except BaseException as exc:
                self._failed(entry, start, exc)
                raise
        vectors = np.concatenate([r.outputs[0] for r in results])
        slowest = RunResult([], max(r.queue_s for r in results), max(r.compute_s for r in results))
        _succeeded(entry.requests, start, len(results), slowest)
        tokens, queue_s, compute_s = int(call.lengths.sum()), slowest.queue_s, slowest.compute_s
        return EmbedResult(entry.name, entry.version, vectors, tokens, queue_s, compute_s)

    def _failed(self, entry: PredictVersion, start: float, exc: BaseException) -> None:
        """A predict (or embed) request failed: counted; a lost device reported."""
        _count(entry.requests, start, ok=False)
        if isinstance(exc, DeviceLostError):
            self.on_device_lost(exc)

    # -- what the server shows ---------------------------------------------------------

    def _build_table(self) -> ModelTable:
        """Every version's state, the readiness verdict, and each READY version's row."""
        entries = []
        versions = self.registry.versions()
        for mv in versions:
            entry = TableEntry(mv.name, mv.version, mv.state, mv.reason, mv.kind, mv.serial)
            if isinstance(mv, GeneratorVersion) and mv.engine is not None:
                entry = self._generator_row(entry, mv.engine)
            elif isinstance(mv, EmbeddingVersion) and mv.spec is not None:
                entry = embedding_row(entry, mv)
            elif isinstance(mv, PredictVersion) and mv.state is ModelState.READY:
                entry = dataclasses.replace(
                    entry,
                    inputs=tuple(mv.inputs),
                    outputs=tuple(mv.outputs),
                    max_batch_size=mv.config.max_batch_size,
                )
            entries.append(entry)
        readiness = Readiness(False, "the models are loading")
        if self.loaded:  # explicit model control with nothing loaded: ready to be asked
            idle = self.registry.explicit and not versions
            readiness = Readiness(True) if idle else judge(self.ready_when, versions)
        return ModelTable(self.loaded, readiness, tuple(entries))

    def _generator_row(self, entry: TableEntry, engine: GenerationEngine) -> TableEntry:
        directory = engine.directory
        spec = directory.spec
        prefix: tuple[int, ...] = ()
        if spec.add_bos_token and spec.bos_token_id is not None:
            prefix = (spec.bos_token_id,)
        admission = GeneratorEntry(
            name=entry.name,
            max_model_len=engine.limits.max_model_len,
            vocab_size=spec.vocab_size,
            max_token_bytes=directory.max_token_bytes,
            defaults=engine.defaults,
            max_prompt_tokens=self.max_prompt_tokens,
        )
        return dataclasses.replace(
            entry,
            generator=admission,
            tokenizer_path=str(spec.tokenizer_path),
            prompt_prefix=prefix,
            chat_template=spec.chat_template,
        )

    async def info(self) -> ServerInfo:
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
            await self.snapshots(""),
        )

    async def snapshots(self, model: str) -> list[ModelSnapshot]:
        """As EngineClient.snapshots; none for a model a reload has just removed (the data
        plane answers from its table, with what its caller may see)."""
        if not model:
            return [model_snapshot(mv) for mv in self.registry.versions()]
        try:
            versions = self.registry.get_versions(model)
        except NotFoundError:
            return []
        return [model_snapshot(mv) for mv in versions]

    # -- the server's life -------------------------------------------------------------

    async def load_models(self) -> None:
        await self.registry.load_all()
        self.loaded = True
        self.models_changed()

    async def reload_models(self, repository: Path) -> RepositoryChanges:
        return await self.registry.reload(repository)

    def terminate_runs(self) -> None:
        self.registry.terminate_runs()

    async def close(self) -> None:
        await self.registry.close()
