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
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from tensord.errors import InternalError, InvalidArgumentError, TensordError
from tensord.generate.core.request import Request
from tensord.generate.core.sampling_params import CONSTRAINT_KINDS
from tensord.generate.core.scheduler_output import SchedulerOutput
from tensord.generate.model.model_dir import GeneratorDirectory
from tensord.generate.worker.grammar import ConstraintLimits, Grammars, Masks, available
from tensord.modelconfig.generator import GeneratorLimits

_COMPILE_THREADS = 2
"""Constraints compiled at once per model: one slow constraint delays no other's."""

Admit = Callable[[Request, TensordError | None], None]
"""Event loop: a request whose compile ended, and why it may not run (None: it may)."""


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
        self._compiling: ThreadPoolExecutor | None = None
        self._masking: ThreadPoolExecutor | None = None

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
        """Compile the request's constraint on a worker thread; `admit(request, error)` runs
        on this event loop when it is done, or when it has taken too long."""
        assert self.grammars is not None and request.sampling_params.constraint is not None
        grammars, constraint = self.grammars, request.sampling_params.constraint
        if self._compiling is None:
            self._compiling = ThreadPoolExecutor(
                _COMPILE_THREADS, thread_name_prefix=f"constraints-{self.name}"
            )
        loop = asyncio.get_running_loop()
        seconds = grammars.limits.compile_seconds
        decided = False

        def decide(error: TensordError | None) -> None:
            nonlocal decided
            if not decided:
                decided = True
                timer.cancel()
                admit(request, error)

        def compiled(future: Future[Any]) -> None:  # a worker thread
            try:
                request.constraint = future.result()
                error: TensordError | None = None
            except TensordError as exc:
                error = exc
            except Exception as exc:
                error = InternalError(f"compiling the constraint failed: {exc!r}")
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(decide, error)

        timer = loop.call_later(
            seconds,
            decide,
            InvalidArgumentError(
                f"the {constraint.kind} constraint did not compile within {seconds:g} s "
                "([generator] constraint_compile_seconds); simplify it"
            ),
        )
        self._compiling.submit(grammars.matcher, constraint).add_done_callback(compiled)

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
    ) -> tuple[list[int], np.ndarray, list[str]]:
        """After the pass: the logits rows (in `row_ids`' order) the masks go to, the masks,
        and the requests whose matcher allows nothing (it has failed)."""
        requests, future = started
        bitmask = future.result()
        where = {request_id: i for i, request_id in enumerate(row_ids)}
        any_allowed = bitmask.any(axis=1).tolist()
        rows, keep, failed = [], [], []
        for i, request in enumerate(requests):
            row = where.get(request.request_id)
            if row is None:
                continue
            if not any_allowed[i]:
                failed.append(request.request_id)
                continue
            rows.append(row)
            keep.append(i)
        if len(keep) == len(requests):
            return rows, bitmask, failed
        return rows, bitmask[keep], failed

    @staticmethod
    def consume(requests: Sequence[Request], tokens: Sequence[int]) -> list[str]:
        """Feed each constrained request its sampled token; the ids whose matcher refused
        it (a failed matcher: the mask allowed it)."""
        refused = []
        for request, token in zip(requests, tokens, strict=True):
            matcher = request.constraint
            if matcher is not None and not matcher.consume_token(token):
                refused.append(request.request_id)
        return refused

    def close(self) -> None:
        for pool in (self._compiling, self._masking):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
