"""A generation engine's structured output: each constrained request's matcher compiled off
the event loop and off the engine thread, each pass's token masks filled while the model
runs, and every sampled token fed back to its matcher (worker/grammar.py does the
llguidance work).

A request whose constraint was compiled before starts at once with a copy of its matcher;
another waits, outside the scheduler, for its compile on a worker thread (at most
`[generator] constraint_compile_seconds`), then joins the queue, or ends with
INVALID_ARGUMENT and the compiler's message. Nothing is scheduled until its matcher exists,
so a slow constraint holds no KV block and no slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensord.errors import (
    InternalError,
    InvalidArgumentError,
    ResourceExhaustedError,
    TensordError,
    UnavailableError,
)
from tensord.generate.core.request import Request
from tensord.generate.core.sampling_params import CONSTRAINT_KINDS, Constraint
from tensord.generate.core.scheduler_output import SchedulerOutput
from tensord.generate.model.model_dir import GeneratorDirectory
from tensord.generate.worker.grammar import (
    ConstraintLimits,
    Grammars,
    Masks,
    available,
)
from tensord.generate.worker.grammar import said as _said
from tensord.modelconfig.generator import GeneratorLimits

_COMPILE_THREADS = 2
"""Constraints compiled at once per model: one slow constraint delays no other's."""

_MAX_JOBS = 64
"""Constraints compiling at once per model when [generator] max_queue_size is 0."""

Admit = Callable[[Request, TensordError | None], None]
"""Event loop: a request whose compile ended, and why it may not run (None: it may)."""


@dataclass(eq=False)
class _Job:
    """One constraint's compile and the requests waiting for it."""

    constraint: Constraint
    loop: asyncio.AbstractEventLoop
    waiters: dict[str, tuple[Request, Admit]] = field(default_factory=dict)
    started: bool = False
    cancelled: bool = False
    timer: asyncio.TimerHandle | None = None
    refusal: str | None = None
    """Set once it ran past its bound: why its requests are refused."""


class Constraints:
    """One engine's constraint compiles, masks and matcher updates."""

    def __init__(self, name: str, directory: GeneratorDirectory, limits: GeneratorLimits) -> None:
        spec = directory.spec
        self.name = name
        self.grammars: Grammars | None = None
        if available():
            self.grammars = Grammars(
                directory.tokenizer,
                spec.vocab_size,
                spec.eos_token_ids,
                ConstraintLimits(limits.max_constraint_bytes, limits.constraint_compile_seconds),
            )
        self._masks = Masks(spec.vocab_size)
        self._jobs: dict[Constraint, _Job] = {}
        """Event loop: the compiles queued or running, by constraint."""
        self._max_jobs = limits.max_queue_size or _MAX_JOBS
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._masking: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The constraint kinds this engine takes (none without llguidance)."""
        return CONSTRAINT_KINDS if self.grammars is not None else ()

    # -- event loop --------------------------------------------------------------------

    def ready(self, request: Request) -> bool:
        """Whether the request may be scheduled now: it has no constraint, or one compiled
        before (its matcher is set). Raises INVALID_ARGUMENT for a constraint refused
        before, or too large to compile."""
        constraint = request.sampling_params.constraint
        if constraint is None:
            return True
        if self.grammars is None:
            raise InvalidArgumentError(
                f"model {self.name!r} cannot constrain its output here: structured output "
                "needs the llguidance package"
            )
        self.grammars.check_size(constraint)
        request.constraint = self.grammars.cached(constraint)
        return request.constraint is not None

    def compile(self, request: Request, admit: Admit) -> None:
        """Compile the request's constraint on a worker thread (requests with the same one
        share its compile); `admit(request, error)` runs on this event loop when it is
        done, or once it has run longer than the bound. RESOURCE_EXHAUSTED when too many
        constraints are compiling already."""
        assert self.grammars is not None and request.sampling_params.constraint is not None
        constraint = request.sampling_params.constraint
        job = self._jobs.get(constraint)
        if job is None:
            if len(self._jobs) >= self._max_jobs:
                raise ResourceExhaustedError(
                    f"{len(self._jobs)} constraints of model {self.name!r} are compiling; "
                    "retry shortly"
                )
            self._loop = asyncio.get_running_loop()
            job = self._jobs[constraint] = _Job(constraint, self._loop)
            self._start_workers()
            self._queue.put(job)
        if job.refusal is not None:
            raise InvalidArgumentError(job.refusal)
        job.waiters[request.request_id] = (request, admit)

    def drop(self, request_id: str) -> None:
        """A request aborted while its constraint compiles: it no longer waits, and a
        compile nobody waits for and not yet begun is not run."""
        for job in list(self._jobs.values()):
            dropped = job.waiters.pop(request_id, None) is not None
            if dropped and not job.waiters and not job.started:
                job.cancelled = True
                self._jobs.pop(job.constraint, None)

    def _start_workers(self) -> None:
        while len(self._workers) < _COMPILE_THREADS:
            worker = threading.Thread(
                target=self._work, name=f"constraints-{self.name}", daemon=True
            )  # daemon: a compile running at exit never holds the process
            worker.start()
            self._workers.append(worker)

    def _work(self) -> None:
        """A compile thread: each job in turn; its bound counts from when it starts."""
        assert self.grammars is not None
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled:
                continue
            job.started = True
            with contextlib.suppress(RuntimeError):  # the loop has closed
                job.loop.call_soon_threadsafe(self._start_timer, job)
            error: TensordError | None = None
            try:
                self.grammars.compile(job.constraint)  # kept: waiters get copies
            except TensordError as exc:
                error = exc
            except Exception as exc:
                error = InternalError(f"compiling the constraint failed: {exc!r}")
            with contextlib.suppress(RuntimeError):
                job.loop.call_soon_threadsafe(self._finished, job, error)

    def _start_timer(self, job: _Job) -> None:
        seconds = self.grammars.limits.compile_seconds if self.grammars else 0.0
        job.timer = job.loop.call_later(seconds, self._timed_out, job, seconds)

    def _timed_out(self, job: _Job, seconds: float) -> None:
        """Event loop: the compile runs on (its result is kept), but its requests, and any
        that ask for the same constraint until it ends, are refused."""
        job.refusal = (
            f"the {job.constraint.kind} constraint did not compile within {seconds:g} s "
            "([generator] constraint_compile_seconds); simplify it"
        )
        self._answer(job, None)

    def _finished(self, job: _Job, error: TensordError | None) -> None:
        if job.timer is not None:
            job.timer.cancel()
        if self._jobs.get(job.constraint) is job:
            del self._jobs[job.constraint]
        if job.refusal is None:
            self._answer(job, error)

    def _answer(self, job: _Job, error: TensordError | None) -> None:
        """Each waiting request gets its own matcher (a copy of the kept one), or why not."""
        assert self.grammars is not None
        waiters, job.waiters = job.waiters, {}
        for request, admit in waiters.values():
            why: TensordError | None = error
            if why is None and job.refusal is not None:
                why = InvalidArgumentError(job.refusal)
            if why is None:
                try:
                    request.constraint = self.grammars.cached(job.constraint)
                except TensordError as exc:
                    why = exc
                if request.constraint is None and why is None:
                    why = UnavailableError("the compiled constraint was dropped; retry")
            admit(request, why)

    # -- the engine thread -------------------------------------------------------------

    def start_masks(self, output: SchedulerOutput) -> tuple[list[Request], Future[Any]] | None:
        """Before the pass: the masks of the constrained requests that sample this step,
        filled on another thread while the model runs; None when there are none."""
        constrained = [
            s.request
            for s in output.scheduled
            if s.sample and s.request is not None and s.request.constraint is not None
        ]
        if not constrained:
            return None
        if self._masking is None:
            self._masking = ThreadPoolExecutor(1, thread_name_prefix=f"masks-{self.name}")
        matchers = [r.constraint for r in constrained]
        return constrained, self._masking.submit(self._masks.fill, matchers)

    @staticmethod
    def masks_after(
        started: tuple[list[Request], Future[Any]], row_ids: Sequence[str]
    ) -> tuple[list[int], np.ndarray, list[tuple[str, TensordError]]]:
        """After the pass: the logits rows (in `row_ids`' order) the masks go to, the masks,
        and the requests whose matcher has failed, with why (a constraint that cannot go on,
        such as one past llguidance's limits, is the request's doing: INVALID_ARGUMENT)."""
        requests, future = started
        bitmask = future.result()
        where = {request_id: i for i, request_id in enumerate(row_ids)}
        any_allowed = bitmask.any(axis=1).tolist()
        rows, keep, failed = [], [], []
        for i, request in enumerate(requests):
            row = where.get(request.request_id)
            if row is None:
                continue
            if request.constraint is None or not any_allowed[i] or _failed(request):
                failed.append((request.request_id, _why(request)))
                continue
            rows.append(row)
            keep.append(i)
        if len(keep) == len(requests):
            return rows, bitmask, failed
        return rows, bitmask[keep], failed

    @staticmethod
    def consume(
        requests: Sequence[Request], tokens: Sequence[int]
    ) -> list[tuple[str, TensordError]]:
        """Feed each constrained request its sampled token; the requests whose matcher
        refused it or failed on it, with why."""
        failed = []
        for request, token in zip(requests, tokens, strict=True):
            matcher = request.constraint
            if matcher is not None and (not matcher.consume_token(token) or _failed(request)):
                failed.append((request.request_id, _why(request)))
        return failed

    def close(self, error: TensordError | None) -> None:
        """The engine has stopped (its thread): compile threads end after their current
        compile, and the requests still waiting for one end with `error`."""
        for _ in self._workers:
            self._queue.put(None)
        if self._masking is not None:
            self._masking.shutdown(wait=False, cancel_futures=True)
        why = error or UnavailableError(f"model {self.name!r} is shutting down")
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                self._loop.call_soon_threadsafe(self._fail_waiting, why)

    def _fail_waiting(self, error: TensordError) -> None:
        for job in list(self._jobs.values()):
            job.cancelled = True
            waiters, job.waiters = job.waiters, {}
            for request, admit in waiters.values():
                admit(request, error)
        self._jobs.clear()


def _failed(request: Request) -> bool:
    matcher: Any = request.constraint
    return bool(matcher.is_error())


def _why(request: Request) -> TensordError:
    """A failed matcher's reason: llguidance's message when it has one (a limit the
    constraint ran into), else an internal error."""
    matcher: Any = request.constraint
    said = matcher.get_error() if matcher is not None and matcher.is_error() else ""
    if said:
        return InvalidArgumentError(f"the constraint cannot go on: {_said(said)}")
    return InternalError("the output's constraint refused the sampled token")
