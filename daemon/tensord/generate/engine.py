"""The generation engine of one generator model: an engine thread and an async front.

The engine thread loops: apply queued aborts, `schedule()` a step, run it on the model
(ModelRunner), sample, `update_from_output`, detokenize and hand each request's chunk to
its OutputStream. The event loop only adds requests, awaits chunks and aborts. The
scheduler is shared under one lock that the thread drops while the model runs, so a new
request is admitted (or refused: queue full, too long) synchronously, before its stream
starts. Aborts are applied between steps: a cancelled stream frees its blocks within one
step, and a running step never writes into blocks handed to someone else.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import structlog

from tensord.errors import (
    DeadlineExceededError,
    InternalError,
    TensordError,
    UnavailableError,
)
from tensord.generate.kv_cache_manager import KVCacheManager, KVCacheStats
from tensord.generate.kv_storage import KVShape, KVStorage
from tensord.generate.model_dir import GeneratorDirectory
from tensord.generate.model_runner import ModelRunner, StepItem
from tensord.generate.output_processor import OutputProcessor
from tensord.generate.outputs import RequestOutput
from tensord.generate.request import Request, RequestStatus
from tensord.generate.sampler import Sampler
from tensord.generate.sampling_params import SamplingParams
from tensord.generate.scheduler import Scheduler, SchedulerConfig
from tensord.generate.scheduler_output import SchedulerOutput
from tensord.generate.stream import OutputStream
from tensord.registry.generator_config import GeneratorLimits

log = structlog.get_logger("tensord.generate")

RunFn = Callable[[Mapping[str, np.ndarray], Sequence[str]], list[np.ndarray]]


@dataclass(slots=True, frozen=True)
class EngineStats:
    """A snapshot for Info and metrics."""

    running: int
    waiting: int
    steps: int
    generated_tokens: int
    prefix_hit_tokens: int
    preemptions: int
    kv_cache: KVCacheStats


@dataclass(slots=True)
class _Live:
    """What the engine keeps per request besides the scheduler's Request."""

    request: Request
    stream: OutputStream
    processor: OutputProcessor


class GenerationEngine:
    """Continuous batching for one model; `generate()` streams one request's chunks."""

    def __init__(
        self, name: str, directory: GeneratorDirectory, limits: GeneratorLimits, run: RunFn
    ) -> None:
        spec = directory.spec
        self.name = name
        self.directory = directory
        self.limits = limits
        shape = KVShape(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.kv_dtype.numpy)
        self.storage = KVStorage(shape, limits.num_blocks, limits.block_size)
        self.kv_cache_manager = KVCacheManager(limits.num_blocks, limits.block_size)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_model_len=limits.max_model_len,
                max_num_seqs=limits.max_num_seqs,
                max_num_batched_tokens=limits.max_num_batched_tokens,
                max_queue_size=limits.max_queue_size,
            ),
            self.kv_cache_manager,
        )
        pad = spec.pad_token_id if spec.pad_token_id is not None else 0
        self.runner = ModelRunner(
            run, self.storage, spec.num_layers, spec.has_position_ids, pad_token_id=pad
        )
        self.sampler = Sampler()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._live: dict[str, _Live] = {}
        self._aborts: list[str] = []
        self._stopping: TensordError | None = None
        self._steps = 0
        self._generated = 0
        self._thread = threading.Thread(target=self._loop, name=f"engine-{name}", daemon=True)
        self._thread.start()

    # -- the async front -------------------------------------------------------------

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        deadline: float | None = None,
        arrival: float | None = None,
    ) -> OutputStream:
        """Admit a request (raises InvalidArgument / ResourceExhausted / Unavailable at
        once) and return the stream its chunks arrive on. Call from the event loop."""
        spec = self.directory.spec
        resolved = params.resolve(
            spec.defaults,
            prompt_len=len(prompt_token_ids),
            max_model_len=self.limits.max_model_len,
            vocab_size=spec.vocab_size,
        )
        request_id = f"{self.name}-{next(self._ids)}"
        arrival = time.monotonic() if arrival is None else arrival
        request = Request(request_id, list(prompt_token_ids), resolved, arrival, deadline)
        stream = OutputStream(request_id, asyncio.get_running_loop())
        processor = OutputProcessor(request, self.directory.tokenizer)
        with self._wake:
            if self._stopping is not None:
                raise self._stopping
            self.scheduler.add_request(request)
            self._live[request_id] = _Live(request, stream, processor)
            self._wake.notify()
        return stream

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        deadline: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Admit, then yield chunks until the last one; a reader that goes away (cancel,
        disconnect, break) aborts the request and frees its blocks."""
        stream = self.add_request(prompt_token_ids, params, deadline)
        try:
            while True:
                chunk = await stream.get()
                yield chunk
                if chunk.finished:
                    return
        finally:
            if not stream.closed:
                self.abort(stream.request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request at the next step boundary (thread-safe)."""
        with self._wake:
            self._aborts.append(request_id)
            self._wake.notify()

    def stats(self) -> EngineStats:
        """Counters and the KV cache's state."""
        with self._lock:
            s = self.scheduler.stats()
            return EngineStats(
                running=s.num_running,
                waiting=s.num_waiting,
                steps=self._steps,
                generated_tokens=self._generated,
                prefix_hit_tokens=s.kv_cache.prefix_hits,
                preemptions=s.num_preemptions,
                kv_cache=s.kv_cache,
            )

    def close(self, error: TensordError | None = None) -> None:
        """End every stream with `error` (UNAVAILABLE by default), free the blocks, stop."""
        with self._wake:
            self._stopping = error or UnavailableError(
                f"model {self.name!r} is shutting down; retry on another instance"
            )
            self._wake.notify()
        self._thread.join(timeout=30)

    # -- the engine thread -------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._aborts or self._stopping or self.scheduler.has_unfinished_requests()):
                    self._wake.wait()
                self._apply_aborts()
                if self._stopping is not None:
                    self._fail(list(self._live), RequestStatus.FINISHED_ABORTED, self._stopping)
                    return
                output = self.scheduler.schedule()
                self._settle_schedule(output)
                if output.is_empty:
                    # Nothing fits now (every block held by requests that are finishing):
                    # wait for an abort, a new request or a deadline.
                    self._wake.wait(timeout=0.01)
                    continue
            try:
                self._step(output)
            except Exception as exc:  # a failed step fails its requests, not the engine
                log.error("engine.step_failed", model=self.name, error=str(exc))
                self.runner.reset()
                error = exc if isinstance(exc, TensordError) else InternalError(
                    f"generation step failed: {exc}"
                )
                with self._lock:
                    ids = [item.request_id for item in output.scheduled]
                    self._fail(ids, RequestStatus.FINISHED_ERROR, error)

    def _apply_aborts(self) -> None:
        if self._aborts:
            aborted, self._aborts = self._aborts, []
            self.scheduler.abort(aborted)
            for request_id in aborted:
                self._live.pop(request_id, None)

    def _settle_schedule(self, output: SchedulerOutput) -> None:
        """Under the lock: answer requests the scheduler finished before running them."""
        if output.preempted_req_ids:
            self.runner.reset()
        for request_id in output.expired_req_ids:
            live = self._live.pop(request_id, None)
            if live is not None:
                waited = time.monotonic() - live.request.arrival_time
                live.stream.fail(DeadlineExceededError.queued_or_running(waited))

    def _step(self, output: SchedulerOutput) -> None:
        items = [
            StepItem(s.request_id, s.token_ids, s.start_pos, s.block_ids, s.sample)
            for s in output.scheduled
        ]
        logits = self.runner.execute(items)
        sampling = [s.request for s in output.scheduled if s.sample]
        sampled: dict[str, int] = {}
        logprobs = {}
        if sampling:
            rows = np.stack([logits[r.request_id] for r in sampling])
            result = self.sampler.sample(rows, sampling)
            for i, request in enumerate(sampling):
                sampled[request.request_id] = int(result.token_ids[i])
                token_logprob = result.logprobs[i]
                if token_logprob is not None:
                    logprobs[request.request_id] = token_logprob
        now = time.monotonic()
        with self._lock:
            self._steps += 1
            self._generated += len(sampled)
            core_outputs = self.scheduler.update_from_output(output, sampled, logprobs)
            for core in core_outputs:
                live = self._live.get(core.request_id)
                if live is None:
                    continue
                chunk = live.processor.process(core, now)
                if live.processor.stopped and not core.finished:
                    # A stop string ended it: the scheduler frees its blocks now.
                    self.scheduler.finish_requests(
                        [core.request_id], RequestStatus.FINISHED_STOPPED
                    )
                if chunk is not None:
                    live.stream.put(chunk)
                if chunk is not None and chunk.finished:
                    del self._live[core.request_id]

    def _fail(self, request_ids: Sequence[str], status: RequestStatus, error: BaseException) -> None:
        """Under the lock: finish requests with `status` and end their streams with `error`."""
        self.scheduler.finish_requests(request_ids, status)
        for request_id in request_ids:
            live = self._live.pop(request_id, None)
            if live is not None:
                live.stream.fail(error)
