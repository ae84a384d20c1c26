"""The generation engine of one generator model: an engine thread and an async front.

The engine thread loops: apply queued aborts and stops, `schedule()` a step, run it on the
model (ModelRunner), sample, `update_from_output`, and hold the step's outputs for the
event loop (OutputHandoff, handoff.py, says when they go). On the loop each request's
outputs go to the sink it was added with (streams.py): the data plane's OutputStreams,
which detokenizes and matches stop strings where the stream is read, or the link to a
frontend process that does. Detokenizing a step overlaps the next step's model run.

The scheduler is shared under one lock that the thread drops while the model runs, so a
new request is admitted (or refused: queue full, too long) synchronously, before its
stream starts. Aborts and stop-string finishes are applied between steps: a cancelled
stream frees its blocks within one step, and a running step never writes into blocks
handed to someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from tensord.errors import DeviceLostError, InternalError, TensordError, UnavailableError
from tensord.generate.core.block_pool import KVCacheBlock
from tensord.generate.core.kv_cache_manager import KVCacheStats
from tensord.generate.core.outputs import EngineCoreOutput, RequestOutput, TokenLogprob
from tensord.generate.core.request import Request, RequestStatus
from tensord.generate.core.sampling_params import (
    GenerationDefaults,
    ResolvedSamplingParams,
    SamplingParams,
)
from tensord.generate.core.scheduler import Scheduler, SchedulerConfig
from tensord.generate.core.scheduler_output import SchedulerOutput
from tensord.generate.core.slot_manager import SlotMove
from tensord.generate.core.slot_prefix import PrefixCopy, PrefixLoad
from tensord.generate.engine.constrained import Constraints
from tensord.generate.engine.handoff import OutputHandoff
from tensord.generate.engine.kv_paths import KVPath
from tensord.generate.engine.streams import OutputSink, OutputStreams
from tensord.generate.model.model_dir import GeneratorDirectory, GeneratorSpec
from tensord.generate.worker.model_runner import PassStats, StepLogits
from tensord.generate.worker.sampler import Sampler
from tensord.modelconfig.generator import GeneratorLimits

log = structlog.get_logger("tensord.generate")

_REQUEST_IDS = itertools.count()
"""Request ids are unique in the process, across engines (one sink may serve several)."""


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
    passes: PassStats
    """Model passes and the sequences they carried (several per pass: shared steps)."""
    slot_moves: int = 0
    """Sequences moved down into a freed slot (the slot path; 0 on the paged path)."""
    step_seconds: float = 0.0
    """Time in steps: scheduling, passes, sampling and bookkeeping (not idle waits)."""
    prefix_query_tokens: int = 0
    """Prompt tokens of admitted requests looked up for a reusable prefix."""
    prefix_store: KVCacheStats | None = None
    """The host prefix store of KV slots (None: the paged pool, or no reuse)."""
    prefix_bytes_loaded: int = 0
    """Bytes copied from the prefix store into slots."""
    prefix_bytes_saved: int = 0
    """Bytes copied from slots into the prefix store."""


def sampling_defaults(spec: GeneratorSpec) -> GenerationDefaults:
    """The model's generation_config as request defaults. As in transformers, a model
    whose generation_config does not set do_sample decodes greedily by default."""
    d = spec.defaults
    return GenerationDefaults(
        temperature=d.temperature if d.do_sample else 0.0,
        top_k=d.top_k,
        top_p=d.top_p,
        repetition_penalty=d.repetition_penalty,
        max_new_tokens=d.max_new_tokens,
        max_length=d.max_length,
        eos_token_ids=spec.eos_token_ids,
    )


class GenerationEngine:
    """Continuous batching for one model; `generate()` streams one request's chunks."""

    def __init__(
        self, name: str, directory: GeneratorDirectory, limits: GeneratorLimits, kv: KVPath
    ) -> None:
        """`kv` is the KV cache the loader built for the model (kv_paths.py): slots for
        fused attention, the paged pool for Optimum exports."""
        spec = directory.spec
        self.name = name
        self.directory = directory
        self.limits = limits
        self.kv = kv
        self.kv_cache_manager = kv.kv_cache_manager
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_model_len=limits.max_model_len,
                max_num_seqs=limits.max_num_seqs,
                max_num_batched_tokens=limits.max_num_batched_tokens,
                max_queue_size=limits.max_queue_size,
            ),
            self.kv_cache_manager,
        )
        self.layout = kv.layout
        """The batch layout and why."""
        self.runner = kv.runner
        self._moves: list[SlotMove] = []
        self.sampler = Sampler()
        self.constraints = Constraints(name, directory, limits)
        self.defaults = sampling_defaults(spec)
        self._sinks: dict[str, tuple[OutputSink, Callable[[], None] | None]] = {}
        """Event loop: each live request's sink, and what to call once it has ended."""
        self._streams: OutputStreams | None = None
        self.on_device_lost: Callable[[DeviceLostError], None] = lambda exc: None
        """Called (engine thread) when a step meets a sticky device error."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._aborts: list[str] = []
        self.handoff = OutputHandoff(self._deliver, limits.stream_interval)
        self._stops: list[str] = []
        self._stopping: TensordError | None = None
        self._steps = 0
        self._generated = 0
        self._step_seconds = 0.0
        self._thread = threading.Thread(target=self._run_loop, name=f"engine-{name}", daemon=True)
        self._thread.start()

    # -- the async front (event loop thread) -------------------------------------------

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | ResolvedSamplingParams,
        deadline: float | None,
        arrival_time: float | None,
        sink: OutputSink,
        on_end: Callable[[], None] | None = None,
        priority: int = 0,
    ) -> str:
        """Admit a request (raises InvalidArgument / ResourceExhausted / Unavailable at
        once) and return its id: its outputs go to `sink`, on the event loop, and `on_end`
        is called there once it has ended (finished, failed, expired, stopped or aborted).
        Parameters the data plane's admission resolved are taken as they are.
        `arrival_time` (time.monotonic()) is when the server received it; `priority`:
        lower runs first (core/scheduler.py)."""
        resolved = self._resolve(params, len(prompt_token_ids))
        self.handoff.loop = asyncio.get_running_loop()
        request_id = f"{self.name}-{next(_REQUEST_IDS)}"
        arrived = time.monotonic() if arrival_time is None else arrival_time
        request = Request(request_id, list(prompt_token_ids), resolved, arrived, deadline, priority)
        ready = self.constraints.ready(request)
        with self._wake:
            if self._stopping is not None:
                raise self._stopping
            if ready:
                self.scheduler.add_request(request)
                self._wake.notify()
            else:  # it joins once its constraint is compiled (never before this returns)
                self.constraints.compile(request, self._admit_compiled)
            self._sinks[request_id] = (sink, on_end)
        return request_id

    def _admit_compiled(self, request: Request, error: TensordError | None) -> None:
        """Event loop: a request's constraint compiled (or was refused, or took too long):
        it joins the queue, or ends with why; an abort meanwhile dropped it."""
        if request.request_id not in self._sinks:
            return
        if error is None:
            try:
                with self._wake:
                    if self._stopping is not None:
                        raise self._stopping
                    self.scheduler.add_request(request)
                    self._wake.notify()
                return
            except TensordError as exc:
                error = exc
        self._ended([request.request_id], error)

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | ResolvedSamplingParams,
        deadline: float | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """One request's chunks, text included, read right here (tools and benchmarks
        that drive an engine without a server); a reader that goes away aborts it."""
        if self._streams is None:
            self._streams = OutputStreams(self.stop, self.abort)
        arrived = time.monotonic() if arrival_time is None else arrival_time
        resolved = self._resolve(params, len(prompt_token_ids))
        request_id = self.add_request(
            prompt_token_ids, resolved, deadline, arrived, self._streams, priority=priority
        )
        collector = self._streams.open(
            request_id, self.directory.tokenizer, prompt_token_ids, resolved, arrived
        )
        chunks = self._streams.stream(request_id, collector)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    def _resolve(
        self, params: SamplingParams | ResolvedSamplingParams, prompt_len: int
    ) -> ResolvedSamplingParams:
        if isinstance(params, ResolvedSamplingParams):
            return params
        return params.resolve(
            self.defaults,
            prompt_len=prompt_len,
            max_model_len=self.limits.max_model_len,
            vocab_size=self.directory.spec.vocab_size,
        )

    def abort(self, request_id: str) -> None:
        """Abort a request (event loop): its sink hears nothing more, its blocks are freed
        at the next step."""
        self._end(request_id)
        self.constraints.drop(request_id)
        with self._wake:
            self._aborts.append(request_id)
            self._wake.notify()

    def stop(self, request_ids: Sequence[str]) -> None:
        """Stop strings ended these requests (event loop): their streams have their last
        chunk; they finish as stopped at the next step."""
        for request_id in request_ids:
            self._end(request_id)
        with self._wake:
            self._stops.extend(request_ids)
            self._wake.notify()

    def _end(self, request_id: str) -> None:
        """Event loop: forget a request's sink, tell its owner it has ended."""
        held = self._sinks.pop(request_id, None)
        if held is not None and held[1] is not None:
            held[1]()

    def stats(self) -> EngineStats:
        """Counters and the KV cache's state."""
        store = self.kv.prefix_store
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
                passes=dataclasses.replace(self.runner.stats),
                slot_moves=self.kv.slots.moves_made if self.kv.slots is not None else 0,
                step_seconds=self._step_seconds,
                prefix_query_tokens=s.kv_cache.prefix_queries,
                prefix_store=self.kv.slots.prefix_stats() if self.kv.slots is not None else None,
                prefix_bytes_loaded=store.bytes_loaded if store is not None else 0,
                prefix_bytes_saved=store.bytes_saved if store is not None else 0,
            )

    def close(self, error: TensordError | None = None) -> None:
        """End every stream with `error` (UNAVAILABLE by default), free the blocks, stop.
        Blocking: call it from a worker thread when an event loop is running."""
        with self._wake:
            self._stopping = error or UnavailableError(
                f"model {self.name!r} is shutting down; retry on another instance"
            )
            self._wake.notify()
        self._thread.join(timeout=30)

    def _deliver(self, outputs: list[EngineCoreOutput]) -> None:
        """Event loop: each sink gets its requests' outputs in one call; a finished
        request ends after its sink has its last output."""
        sinks = self._sinks
        groups: dict[int, tuple[OutputSink, list[EngineCoreOutput]]] = {}
        finished = []
        for output in outputs:
            held = sinks.get(output.request_id)
            if held is None:
                continue  # aborted or stopped while the step ran
            group = groups.get(id(held[0]))
            if group is None:
                groups[id(held[0])] = (held[0], [output])
            else:
                group[1].append(output)
            if output.finished:
                finished.append(output.request_id)
        try:
            for sink, theirs in groups.values():
                try:
                    sink.outputs(theirs)
                except Exception as exc:  # one sink's failure must not stall the others
                    self._sink_failed(sink, theirs, exc)
        finally:
            for request_id in finished:
                self._end(request_id)

    def _sink_failed(
        self, sink: OutputSink, outputs: list[EngineCoreOutput], exc: Exception
    ) -> None:
        """A sink raised on its outputs: its requests end with INTERNAL and stop here."""
        log.error("engine.sink_failed", model=self.name, error=repr(exc), exc_info=exc)
        ids = list(dict.fromkeys(o.request_id for o in outputs if o.request_id in self._sinks))
        error = InternalError("streaming the generated tokens failed; the log says why")
        with contextlib.suppress(Exception):
            sink.failed(ids, error)
        for request_id in ids:
            self.abort(request_id)

    def _ended(self, request_ids: Sequence[str], error: TensordError | None) -> None:
        """Event loop: these requests failed with `error`, or (None) their deadlines
        passed; their sinks hear it."""
        for request_id in request_ids:
            held = self._sinks.get(request_id)
            if held is None:
                continue
            if error is None:
                held[0].expired([request_id])
            else:
                held[0].failed([request_id], error)
            self._end(request_id)

    # -- the engine thread -------------------------------------------------------------

    def _run_loop(self) -> None:
        try:
            self._loop()
        finally:
            self.kv.close()
            self.constraints.close(self._stopping)

    def _loop(self) -> None:
        while True:
            with self._wake:
                if not self._has_work():
                    self.handoff.release_held()
                while not self._has_work():
                    self._wake.wait()
                began = time.perf_counter()
                self._apply_aborts_and_stops()
                if self._stopping is not None:
                    self._fail(list(self.scheduler.requests), self._stopping)
                    return
                # Slots freed since the last step are closed before this step's requests
                # learn their slots (deadlines passing inside schedule() leave holes for
                # the next step: a decode pass splits around a hole, never reads it).
                self._moves.extend(self.kv.take_moves())
                output = self.scheduler.schedule()
                loads = self.kv.take_loads()  # stored prefixes of requests that joined
                if output.preempted_req_ids:
                    self.runner.reset()
                if output.expired_req_ids:
                    self.handoff.call_after_held(self._ended, output.expired_req_ids, None)
                if output.is_empty:
                    # Nothing fits now: wait for an abort, a new request or a deadline.
                    self.handoff.release_held()
                    self._wake.wait(timeout=0.01)
                    continue
            try:
                self._step(output, began, loads)
            except Exception as exc:  # a failed step fails its requests, not the engine
                log.error("engine.step_failed", model=self.name, error=repr(exc), exc_info=exc)
                if isinstance(exc, DeviceLostError):
                    self.on_device_lost(exc)
                self.runner.reset()
                error = (
                    exc
                    if isinstance(exc, TensordError)
                    else InternalError(
                        f"generation step failed ({type(exc).__name__}); the server log has "
                        "the details (engine.step_failed)"
                    )
                )
                with self._lock:
                    self.kv.discard_saves()  # owed by a step that did not finish
                    self._fail([item.request_id for item in output.scheduled], error)

    def _has_work(self) -> bool:
        return bool(
            self._aborts
            or self._stops
            or self._stopping
            or self.scheduler.has_unfinished_requests()
        )

    def _apply_aborts_and_stops(self) -> None:
        if self._aborts:
            aborted, self._aborts = self._aborts, []
            self.scheduler.abort(aborted)
        if self._stops:
            stopped, self._stops = self._stops, []
            self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)

    def _step(self, output: SchedulerOutput, began: float, loads: list[PrefixLoad]) -> None:
        streams = len(output.scheduled)
        try:
            self._copy_slots(loads)
        finally:
            if loads:
                with self._lock:
                    self.kv.loads_done(loads)
        masking = self.constraints.start_masks(output)  # filled while the model runs
        logits = self.runner.execute(
            output.scheduled, before_run=lambda: self.handoff.release_due(streams)
        )
        sampled, logprobs, refused = self._sample(output, logits, masking)
        with self._lock:
            for request_id, why in refused:
                self._fail([request_id], why)
            self._steps += 1
            self._generated += len(sampled)
            core_outputs = self.scheduler.update_from_output(output, sampled, logprobs)
            saves, saving = self.kv.take_saves()
            self._step_seconds += time.perf_counter() - began
            requests = self.scheduler.requests
            urgent = [  # finished, or this output holds the request's first tokens
                out.request_id
                for out in core_outputs
                if (request := requests.get(out.request_id)) is None
                or out.finished
                or request.num_output_tokens == len(out.new_token_ids)
            ]
        try:
            self.handoff.hold(core_outputs, urgent)
        finally:
            if saving:  # before the next step's moves and passes change any slot
                self._save(saves, saving)

    def _save(self, saves: list[PrefixCopy], saving: list[tuple[KVCacheBlock, bytes]]) -> None:
        """Copy a step's full blocks into the prefix store; a failed copy only means the
        store misses them."""
        began = time.perf_counter()
        done = False
        try:
            self.kv.apply_saves(saves)
            done = True
        except Exception as exc:
            log.warning("engine.prefix_save_failed", model=self.name, error=repr(exc))
        with self._lock:
            self.kv.saved(saving, done)
            self._step_seconds += time.perf_counter() - began

    def _copy_slots(self, loads: list[PrefixLoad]) -> None:
        """Before a step's passes: sequences moved down into freed slots, then stored
        prefixes copied into the slots of requests that joined (a failed copy fails the
        step: those prompts would read stale slots)."""
        if self._moves:
            moves, self._moves = self._moves, []
            try:
                self.kv.apply_moves(moves)
            except Exception:
                # The slot manager has rehomed them: whoever did not get its bytes, running
                # this step or not, would decode over another's. End every held sequence.
                with self._lock:
                    held = [r.request_id for r in self.scheduler.running]
                    self._fail(held, InternalError("moving KV slots failed; the log says why"))
                raise
        if loads:
            self.kv.apply_loads(loads)

    def _sample(
        self,
        output: SchedulerOutput,
        logits: StepLogits,
        masking: tuple[list[Request], Future[Any]] | None,
    ) -> tuple[dict[str, int], dict[str, TokenLogprob], list[tuple[str, TensordError]]]:
        """One token per row of the step's logits, for the request the row belongs to,
        inside its constraint where it has one; and the requests whose constraint failed."""
        if not logits.request_ids:
            return {}, {}, []
        by_id = {s.request_id: s.request for s in output.scheduled if s.request is not None}
        requests = [by_id[request_id] for request_id in logits.request_ids]
        masks: tuple[list[int], np.ndarray] | None = None
        refused: list[tuple[str, TensordError]] = []
        if masking is not None:
            rows, bitmask, refused = self.constraints.masks_after(masking, logits.request_ids)
            masks = (rows, bitmask)
        result = self.sampler.sample(logits.rows, requests, masks)
        tokens = result.token_ids.tolist()
        if masks is not None:
            rows = masks[0]
            refused += self.constraints.consume(
                [requests[i] for i in rows], [tokens[i] for i in rows]
            )
        gone = {request_id for request_id, _ in refused}
        sampled = {
            request_id: token
            for request_id, token in zip(logits.request_ids, tokens, strict=True)
            if request_id not in gone
        }
        logprobs = {
            request_id: lp
            for request_id, lp in zip(logits.request_ids, result.logprobs, strict=True)
            if lp is not None
        }
        return sampled, logprobs, refused

    def _fail(self, request_ids: Sequence[str], error: TensordError) -> None:
        """Under the lock: finish requests (blocks freed) and end their streams with error."""
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ERROR)
        self.handoff.call_after_held(self._ended, list(request_ids), error)
