"""The registry: every model version, its state, and the executor that runs it."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import structlog

from tensord.access import may_see
from tensord.backends.base import Backend, DeviceOptions, TensorSpec
from tensord.backends.signature import check_batching
from tensord.batching.batcher import BatchingSettings, DynamicBatcher
from tensord.dtypes import DType
from tensord.errors import (
    DeviceLostError,
    FailedPreconditionError,
    ModelLoadError,
    NotFoundError,
    UnavailableError,
)
from tensord.executor.base import Executor
from tensord.executor.cpu import CpuExecutor
from tensord.executor.select import build_executor, build_tensorrt_executor
from tensord.executor.split import run_splitting_on_oom
from tensord.modelconfig.model import ModelConfig
from tensord.processing.wrap import served_signature, with_processing
from tensord.registry.changes import ReloadPlan, RepositoryChanges, label, plan_reload
from tensord.registry.repository import VersionSource, read_repository
from tensord.registry.version import (
    EMBED_INPUT,
    EMBED_OUTPUT,
    EmbeddingVersion,
    GeneratorVersion,
    ModelState,
    ModelVersion,
    PredictVersion,
    from_source,
)

log = structlog.get_logger("tensord.registry")


@dataclass(slots=True, frozen=True)
class IndexEntry:
    """One model version of the repository index (KServe's RepositoryIndex)."""

    name: str
    version: int
    """0 for a model not loaded."""
    state: ModelState | None
    """None: in the repository, not loaded."""
    reason: str


def release_memory() -> None:
    """Give freed heap back to the system (glibc keeps it for reuse otherwise: a process
    that unloaded a model would keep its size)."""
    import ctypes

    libc = ctypes.CDLL(None)  # the C library this process runs on
    trim = getattr(libc, "malloc_trim", None)  # glibc's; musl has none
    if trim is not None:
        trim(0)


BackendFactory = Callable[[Path, ModelConfig, DeviceOptions], Backend]


def default_backend_factory(path: Path, config: ModelConfig, where: DeviceOptions) -> Backend:
    """The backend named in model.toml."""
    if config.backend == "tensorrt":
        from tensord.backends.tensorrt import TensorRTBackend

        return TensorRTBackend(path, config, where)
    from tensord.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend(path, config, where)


class ModelRegistry:
    """Loads a repository and answers which version serves a request."""

    def __init__(
        self,
        repository: Path,
        backend_factory: BackendFactory = default_backend_factory,
        on_change: Callable[[], None] | None = None,
        where: DeviceOptions | None = None,
    ) -> None:
        self._where = where or DeviceOptions()
        self.repository = repository
        self.follow_symlinks = False
        """Serve model files that symlinks lead outside their model's directory (the
        config's follow_model_symlinks; the server sets it, and each reload)."""
        self._factory = backend_factory
        self._on_change = on_change or (lambda: None)
        self._models: dict[str, dict[int, ModelVersion]] = {}
        self._retiring: dict[asyncio.Task[None], ModelVersion] = {}
        self.on_device_lost: Callable[[DeviceLostError], None] = lambda exc: None
        """Called when a load meets a sticky device error (the server restarts)."""
        self.explicit = False
        """[server] model_control = "explicit": only the models asked for are loaded."""
        self.wanted: set[str] = set()
        """In explicit mode, the models loaded (or asked for): [server] load_models at
        start, then each load and unload; `*` in it stands for every model."""
        self.unloaded: set[str] = set()
        """In explicit mode, the models unloaded on request (which `*` no longer brings back
        on a reload)."""
        self._changing = asyncio.Lock()
        """One change of the repository's models at a time (a reload, a load, an unload)."""

    def versions(self) -> list[ModelVersion]:
        """Every model version, by name then version."""
        return [mv for name in sorted(self._models) for _, mv in sorted(self._models[name].items())]

    def names(self) -> list[str]:
        """Model names."""
        return sorted(self._models)

    def set_model_control(self, mode: str, load_models: Iterable[str]) -> None:
        """[server] model_control and load_models (set before the first load)."""
        self.explicit = mode == "explicit"
        self.wanted = set(load_models)

    def _wants(self, name: str) -> bool:
        if not self.explicit or name in self.wanted:
            return True
        return "*" in self.wanted and name not in self.unloaded

    async def load_all(self) -> None:
        """Scan the repository and load every version concurrently on worker threads (in
        explicit mode, those of the models asked for). Loads, unloads and reloads asked for
        meanwhile wait for it."""
        async with self._changing:
            await self._load_all()

    async def _load_all(self) -> None:
        scanned = await self._scan()
        sources = [src for src in scanned if self._wants(src.name)]
        for name in sorted(self.wanted - {"*"} - {src.name for src in scanned}):
            log.warning(
                "model_control.unknown_model",
                model=name,
                reason="[server] load_models names a model the repository does not hold",
            )
        entries = [from_source(src) for src in sources]
        for entry in entries:
            self._models.setdefault(entry.name, {})[entry.version] = entry
        self._on_change()
        await asyncio.gather(
            *(self._load(entry, src.error) for entry, src in zip(entries, sources, strict=True))
        )

    async def _scan(self) -> list[VersionSource]:
        """Scan the repository on a worker thread; log each entry that is not served."""
        found = await asyncio.to_thread(read_repository, self.repository, self.follow_symlinks)
        for skipped in found.skipped:
            (log.warning if skipped.notable else log.info)(
                "repository.skipped",
                entry=_relative(skipped.path, self.repository),
                reason=skipped.reason,
            )
        return found.sources

    async def _load(self, entry: ModelVersion, error: str = "") -> None:
        """Load one entry (in the registry or not yet) and set its state: READY or FAILED."""
        start = time.monotonic()
        try:
            if error:
                raise ModelLoadError(error)
            await asyncio.to_thread(self._load_blocking, entry)
            if isinstance(entry, PredictVersion):
                entry.batcher = _make_batcher(entry)
        except ModelLoadError as exc:
            entry.state, entry.reason = ModelState.FAILED, str(exc)
        except DeviceLostError as exc:
            entry.state, entry.reason = ModelState.FAILED, str(exc)
            self.on_device_lost(exc)
        except Exception as exc:  # a model must never take the daemon down
            entry.state, entry.reason = ModelState.FAILED, f"unexpected load error: {exc!r}"
        else:
            entry.state = ModelState.READY
        entry.load_time_s = time.monotonic() - start
        self._log_loaded(entry)
        self._on_change()

    async def reload(self, repository: Path | None = None) -> RepositoryChanges:
        """Scan again; load new and changed versions, unload removed ones.

        A changed version loads beside the one serving, which keeps answering until the new
        one is READY and is freed after its running requests finish; if the new one fails,
        the old one stays. A removed version turns UNLOADING (new requests go to another
        version or get UNAVAILABLE), finishes what it runs, then disappears.
        """
        async with self._changing:
            if repository is not None:
                self.repository = repository
            sources = [src for src in await self._scan() if self._wants(src.name)]
            return await self._apply(plan_reload(self._serving(), sources))

    async def load_model(self, name: str) -> RepositoryChanges:
        """Load (or load again, if its files changed) every version of one model of the
        repository: NOT_FOUND when the repository has no such model, FAILED_PRECONDITION
        when model control is off or no version of it becomes READY."""
        self._check_control()
        # Shielded: a caller that goes away (its deadline, a cancel) stops waiting, never
        # the load, which would leave versions LOADING or an executor nobody frees.
        changes = await asyncio.shield(asyncio.ensure_future(self._load_model(name)))
        versions = self._models.get(name, {}).values()
        if not any(mv.state is ModelState.READY for mv in versions):
            reasons = "; ".join(f"v{mv.version}: {mv.reason}" for mv in versions if mv.reason)
            raise FailedPreconditionError(f"model {name!r} did not load: {reasons}")
        return changes

    async def _load_model(self, name: str) -> RepositoryChanges:
        async with self._changing:
            await self._retired(name)  # an unload of it still draining: finished first
            scanned = await self._scan()
            sources = [src for src in scanned if src.name == name]
            if not sources:
                raise not_found(name, sorted({src.name for src in scanned}))
            self.wanted.add(name)
            self.unloaded.discard(name)
            served = {k: v for k, v in self._serving().items() if k == name}
            return await self._apply(plan_reload(served, sources))

    async def _retired(self, name: str) -> None:
        await asyncio.gather(*(t for t, entry in self._retiring.items() if entry.name == name))

    def _serving(self) -> dict[str, dict[int, ModelVersion]]:
        """The versions a reload plans from: those not being unloaded."""
        served = {}
        for name, versions in self._models.items():
            kept = {v: e for v, e in versions.items() if e.state is not ModelState.UNLOADING}
            if kept:
                served[name] = kept
        return served

    async def unload_model(self, name: str) -> bool:
        """Unload every version of one model: each turns UNLOADING (new calls get
        UNAVAILABLE), finishes the calls it holds, and is freed; this returns once all are
        (memory goes back to the system). False when nothing of it was loaded."""
        self._check_control()
        async with self._changing:
            self.wanted.discard(name)
            self.unloaded.add(name)
            versions = [
                e
                for e in self._models.get(name, {}).values()
                if e.state is not ModelState.UNLOADING
            ]
            for entry in versions:
                entry.state = ModelState.UNLOADING
                self._retire(entry, remove=True)
            if versions:
                self._on_change()
        # Shielded: a caller that stops waiting leaves the drain and the freeing to go on.
        await asyncio.shield(self._retired(name))
        if versions:
            await asyncio.to_thread(release_memory)
        return bool(versions)

    async def repository_index(self) -> list[IndexEntry]:
        """Every model of the repository and every version served: its state and reason
        (a model not loaded: state None, version 0)."""
        scanned = {src.name for src in await self._scan()}
        index = []
        for name in sorted(scanned | set(self._models)):
            versions = self._models.get(name, {})
            if not versions:
                index.append(IndexEntry(name, 0, None, "not loaded"))
            for version, mv in sorted(versions.items()):
                index.append(IndexEntry(name, version, mv.state, mv.reason))
        return index

    def _check_control(self) -> None:
        if not self.explicit:
            raise FailedPreconditionError(
                'model control is off: [server] model_control = "none" loads every model of '
                'the repository at start and on a reload (SIGHUP); set it to "explicit" to '
                "load and unload models on request"
            )

    async def _apply(self, plan: ReloadPlan) -> RepositoryChanges:
        """Carry out a reload's plan: load what is new and changed, retire what went."""
        changes = RepositoryChanges(unchanged=plan.unchanged)
        added = [from_source(src) for src in plan.added]
        for entry in added:
            self._models.setdefault(entry.name, {})[entry.version] = entry
        for entry, reason in plan.kept:
            log.error(
                "model.reload_failed",
                model=entry.name,
                version=entry.version,
                reason=reason,
                kept="the version loaded before",
            )
            changes.failed.append(label(entry.name, entry.version))
        for src, entry in plan.retagged:  # only keys such as `required` changed
            entry.config = src.config
        for entry in plan.removed:
            entry.state = ModelState.UNLOADING
            changes.removed.append(label(entry.name, entry.version))
            self._retire(entry, remove=True)
        self._on_change()
        loads = [self._load(entry, src.error) for entry, src in zip(added, plan.added, strict=True)]
        await asyncio.gather(
            *loads, *(self._replace(src, old, changes) for src, old in plan.changed)
        )
        for entry in added:
            target = changes.added if entry.state is ModelState.READY else changes.failed
            target.append(label(entry.name, entry.version))
        return changes

    async def _replace(
        self, src: VersionSource, old: ModelVersion, changes: RepositoryChanges
    ) -> None:
        """Load a changed version beside the old one and swap them once it is READY."""
        new = from_source(src)
        serving = old.state is ModelState.READY
        if not serving:  # nothing to keep: show the new attempt as LOADING at once
            self._models[src.name][src.version] = new
            self._on_change()
        await self._load(new, src.error)
        name = label(src.name, src.version)
        if new.state is not ModelState.READY and serving:
            log.error(
                "model.reload_failed",
                model=src.name,
                version=src.version,
                reason=new.reason,
                kept="the version loaded before",
            )
            changes.failed.append(name)
            return
        self._models[src.name][src.version] = new
        (changes.changed if new.state is ModelState.READY else changes.failed).append(name)
        self._on_change()
        if serving:
            self._retire(old, remove=False)

    def _retire(self, entry: ModelVersion, *, remove: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._unload(entry, remove))
        self._retiring[task] = entry
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    async def _unload(self, entry: ModelVersion, remove: bool) -> None:
        """Free a version once its running requests have finished (a call that picked it
        before it was swapped out may still start while this waits)."""
        while entry.inflight.count:
            await entry.inflight.wait_idle()
        if remove:
            versions = self._models.get(entry.name, {})
            if versions.get(entry.version) is entry:
                del versions[entry.version]
                if not versions:
                    del self._models[entry.name]
            self._on_change()
        await _free(entry)
        log.info("model.unloaded", model=entry.name, version=entry.version, replaced=not remove)

    def _load_blocking(self, entry: ModelVersion) -> None:
        match entry:
            case GeneratorVersion():
                from tensord.generate.engine.loader import load_engine

                entry.engine, entry.placement, entry.inputs, entry.outputs = load_engine(
                    entry.name, entry.path, entry.config, self._where
                )
            case EmbeddingVersion():
                self._load_embedding(entry)
            case PredictVersion():
                self._load_predict(entry)

    def _load_predict(self, entry: PredictVersion) -> None:
        config = entry.config

        def make(where: DeviceOptions) -> Backend:
            return with_processing(self._factory(entry.path, config, where), config, where)

        if config.backend == "tensorrt":
            executor, backend = build_tensorrt_executor(
                entry.name, make, config.instances_on("cuda"), self._where
            )
        else:
            backend = make(self._where)
            try:
                executor, backend = build_executor(
                    entry.name, backend, make, config.instances_on, self._where
                )
            except BaseException:
                backend.close()
                raise
        try:
            entry.inputs, entry.outputs = served_signature(backend, entry.config)
            check_batching(entry.config, [*entry.inputs, *entry.outputs])
            if entry.config.warmup:
                _warm_up(executor, entry)
        except BaseException:
            executor.close()  # the executor owns its backend sessions
            raise
        entry.executor, entry.placement = executor, backend.placement
        entry.processing = list(getattr(backend, "processing", []))

    def _load_embedding(self, entry: EmbeddingVersion) -> None:
        """A text encoder with pooling after it, on the predict executor; its served
        signature is texts in, vectors out (the data plane tokenises)."""
        from tensord.embedding.folder import read_embedding_folder
        from tensord.embedding.loader import embedding_backend, warm_up_embedding

        config = entry.config
        directory = entry.path.parents[len(Path(config.model_file).parts) - 1]
        spec = read_embedding_folder(directory, config.model_file, config.embedding)

        backend = embedding_backend(self._factory(entry.path, config, self._where), spec)
        # Host arrays on every provider: the pooling runs on them (NumPy), and a GPU
        # provider's session copies a run's inputs in and its outputs out itself.
        provider = backend.placement.provider
        reason = f"the model runs on {provider}; its texts are padded and pooled on the host"
        executor = CpuExecutor(entry.name, backend, config.instances_on("cpu"), reason)
        try:
            entry.token_inputs = list(backend.inputs)
            spec = warm_up_embedding(executor, spec, entry.token_inputs)
        except BaseException:
            executor.close()
            raise
        entry.spec = spec
        entry.inputs, entry.outputs = embedding_signature(spec.dimensions)
        entry.executor, entry.placement = executor, backend.placement
        entry.processing = list(getattr(backend, "processing", []))

    @staticmethod
    def _log_loaded(entry: ModelVersion) -> None:
        fields = {
            "model": entry.name,
            "version": entry.version,
            "load_ms": round(entry.load_time_s * 1e3, 1),
        }
        if entry.state is ModelState.READY and entry.placement is not None:
            p = entry.placement
            executor = entry.executor if isinstance(entry, PredictVersion) else None
            processing = entry.processing if isinstance(entry, PredictVersion) else []
            log.info(
                "model.loaded",
                **fields,
                backend=p.backend,
                provider=p.provider,
                executor=executor.kind if executor else None,
                provider_reason=p.provider_reason,
                executor_reason=executor.reason if executor else None,
                batching=isinstance(entry, PredictVersion) and entry.batcher is not None,
                processing=[f"{r.kind}:{r.device}" for r in processing] or None,
            )
        else:
            log.error("model.failed", **fields, reason=entry.reason)

    def get_versions(self, name: str) -> list[ModelVersion]:
        """Every version of one model; NOT_FOUND for an unknown name."""
        versions = self._models.get(name)
        if versions is None:
            raise not_found(name, self.names())
        return [mv for _, mv in sorted(versions.items())]

    def get(self, name: str, version: int = 0, redact: Callable[[str], str] = str) -> ModelVersion:
        """The version to serve (version 0: the newest READY one): see pick_version."""
        return pick_version(name, self._models.get(name), version, redact, self.names)

    def version(self, name: str, version: int) -> ModelVersion | None:
        """That exact version, whatever its state; None when the registry has none."""
        return self._models.get(name, {}).get(version)

    def terminate_runs(self) -> None:
        """Cut every model run in progress short (the drain's grace has run out)."""
        for entry in [*self._retiring.values(), *self.versions()]:
            if isinstance(entry, PredictVersion) and entry.executor is not None:
                entry.executor.terminate_runs()

    async def close(self) -> None:
        """Mark every version UNLOADING, then free the backends (and any being retired)."""
        for entry in self.versions():
            entry.state = ModelState.UNLOADING
        self._on_change()
        retiring = dict(self._retiring)
        for task in retiring:
            task.cancel()
        await asyncio.gather(*retiring, return_exceptions=True)
        for entry in [*retiring.values(), *self.versions()]:
            await _free(entry)


async def _free(entry: ModelVersion) -> None:
    """Close a version's batcher, executor (which owns its backend sessions) and generation
    engine (which ends its streams with UNAVAILABLE).

    Idempotent: the entry lets go of them first."""
    match entry:
        case PredictVersion():
            batcher, executor = entry.batcher, entry.executor
            entry.batcher = entry.executor = None
            if batcher is not None:
                await batcher.close()
            if executor is not None:
                executor.close()
        case GeneratorVersion():
            engine, entry.engine = entry.engine, None
            if engine is not None:
                await asyncio.to_thread(engine.close)


class Stated(Protocol):
    """A model version as calls are sent to it: the registry's, or the model table's."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def state(self) -> ModelState: ...
    @property
    def reason(self) -> str: ...


V = TypeVar("V", bound=Stated)


def pick_version(
    name: str,
    versions: Mapping[int, V] | None,
    version: int,
    redact: Callable[[str], str],
    names: Callable[[], Iterable[str]],
) -> V:
    """The version a call for (`name`, `version`) goes to, of a model's `versions`
    (None: no such model; `names()` lists the models there are): version 0 is the newest
    READY one. NOT_FOUND for unknown names and versions; UNAVAILABLE while it loads or
    unloads (clients retry); FAILED_PRECONDITION when it failed to load, with the reason as
    `redact` shows it to this caller (clients do not retry: it stays FAILED until a
    reload fixes it)."""
    if versions is None:
        raise not_found(name, names())
    if version:
        entry = versions.get(version)
        if entry is None:
            raise NotFoundError(
                f"model {name!r} has no version {version}; versions: "
                f"{', '.join(str(v) for v in sorted(versions))} (0 means the newest ready)"
            )
        if entry.state is not ModelState.READY:
            raise not_ready_error(entry, redact)
        return entry
    newest = max((v for v, mv in versions.items() if mv.state is ModelState.READY), default=None)
    if newest is None:
        # A version still loading (or unloading) is worth a retry; only when every
        # version failed is the answer final.
        settling = [v for v, mv in versions.items() if mv.state is not ModelState.FAILED]
        raise not_ready_error(versions[max(settling or versions)], redact)
    return versions[newest]


def not_found(name: str, names: Iterable[str]) -> NotFoundError:
    """NOT_FOUND listing the models the caller may learn about (its token's)."""
    known = ", ".join(n for n in names if may_see(n)) or "none"
    return NotFoundError(f"model {name!r} not found; models: {known}")


def not_ready_error(
    entry: Stated, redact: Callable[[str], str] = str
) -> UnavailableError | FailedPreconditionError:
    """What a call for a version that is not READY gets: FAILED_PRECONDITION with the
    reason (`redact` leaves out what this caller may not see) for a version that failed to
    load, UNAVAILABLE for one that is loading or unloading (transient: clients retry)."""
    where = f"model {entry.name!r} version {entry.version}"
    if entry.state is ModelState.FAILED:
        return FailedPreconditionError(
            f"{where} is FAILED: {redact(entry.reason)}; it serves again once fixed and "
            "the daemon reloaded (SIGHUP)"
        )
    return UnavailableError(f"{where} is {entry.state.name}; retry shortly")


def _relative(path: Path, root: Path) -> str:
    """`path` as the repository's operators name it: from the repository's root."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _make_batcher(entry: PredictVersion) -> DynamicBatcher | None:
    """A batcher when model.toml has [dynamic_batching], or packing an embedding model's
    texts by length (created on the event loop)."""
    config, executor = entry.config, entry.executor
    if isinstance(entry, EmbeddingVersion) and executor is not None and entry.spec is not None:
        return _embedding_batcher(entry, executor)
    if config.dynamic_batching is None or executor is None:
        return None
    db = config.dynamic_batching
    settings = BatchingSettings(
        max_batch_size=config.max_batch_size,
        preferred_batch_size=tuple(db.preferred_batch_size),
        max_queue_delay_s=db.max_queue_delay_microseconds / 1e6,
        max_queue_size=db.max_queue_size,
        default_timeout_s=db.default_timeout_microseconds / 1e6,
        instances=config.instances_on(executor.kind),
    )
    return DynamicBatcher(
        entry.name, settings, functools.partial(run_splitting_on_oom, executor.run)
    )


def _embedding_batcher(entry: EmbeddingVersion, executor: Executor) -> DynamicBatcher:
    from tensord.embedding.folder import INPUT_IDS

    assert entry.config.embedding is not None and entry.spec is not None
    emb = entry.config.embedding
    settings = BatchingSettings(
        max_batch_size=emb.max_batch_size,
        max_queue_delay_s=emb.max_queue_delay_microseconds / 1e6,
        max_queue_size=emb.max_queue_size,
        instances=entry.config.instances_on(executor.kind),
        # Unset in model.toml, the budget grows to hold one text of the longest kind.
        max_batch_tokens=max(emb.max_batch_tokens, entry.spec.max_seq_length),
        pad_values=((INPUT_IDS, entry.spec.pad_token_id),),
    )
    return DynamicBatcher(
        entry.name, settings, functools.partial(run_splitting_on_oom, executor.run)
    )


def embedding_signature(dimensions: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """What Predict serves for an embedding model: texts in, vectors out."""
    return (
        [TensorSpec(EMBED_INPUT, DType.STRING, (-1,))],
        [TensorSpec(EMBED_OUTPUT, DType.FLOAT32, (-1, dimensions or -1))],
    )


def _warm_up(executor: Executor, entry: PredictVersion) -> None:
    """One run on zeros (batch 1, dynamic dims 1) so the first request pays no lazy set-up."""
    feeds = {}
    for spec in entry.inputs:
        shape = tuple(1 if d == -1 else d for d in spec.shape)
        if spec.dtype is DType.STRING:
            feeds[spec.name] = np.full(shape, "", dtype=object)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=spec.dtype.numpy)
    try:
        executor.run_blocking(feeds, [spec.name for spec in entry.outputs])
    except DeviceLostError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"warm-up run on zeros failed: {exc}; set warmup = false in model.toml if the "
            "model cannot run on zeros"
        ) from None
