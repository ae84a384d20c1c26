"""One generation request as the engine sees it: tokens, progress, state and why it ended."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tensord.generate.core.sampling_params import ResolvedSamplingParams


class TokenConstraint(Protocol):
    """A request's structured-output matcher (worker/grammar.py): which tokens may come
    next, and whether the structure is complete."""

    def consume_token(self, token: int) -> bool: ...

    def is_stopped(self) -> bool: ...


class RequestStatus(enum.IntEnum):
    """Where a request stands. Every finished state sorts after every live one."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Finished states: keep them last, `is_finished` is a range test.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_DEADLINE = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def is_finished(self) -> bool:
        """True for every FINISHED_* state."""
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        """The contract's finish reason for a normal end ("stop", "length"), else None."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
}


@dataclass(slots=True, eq=False)
class Request:
    """A prompt, its sampling choices, and everything generated or computed so far.

    `num_computed_tokens` counts the leading tokens (prompt, then output) whose keys and
    values are in the KV cache. A preempted request drops to 0 and recomputes its prompt
    and the tokens it already generated, which it keeps.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: ResolvedSamplingParams
    arrival_time: float
    """time.monotonic() when the request was received."""
    deadline: float | None = None
    """time.monotonic() by which it must finish; None for no deadline."""
    priority: int = 0
    """Lower runs first: it is admitted before, and may preempt, requests of a higher
    value; equal priorities are first come, first served."""
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    """The prompt followed by the output; filled from the prompt on creation."""
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    """The token id or stop string that ended it, when one did."""
    num_preemptions: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    """Chained hashes of its full blocks of tokens, kept by the KV cache manager."""
    arrival_seq: int = -1
    """Order of arrival given by the scheduler: first come, first served."""
    generator: np.random.Generator = field(init=False)
    """This request's own random stream, so other requests in the batch never change it."""
    seen_token_mask: np.ndarray | None = field(default=None, init=False, repr=False)
    """bool [V]: tokens in the prompt or output, kept by the sampler for the repetition
    penalty and brought up to date from `all_token_ids[seen_token_count:]`."""
    seen_token_count: int = field(default=0, init=False, repr=False)
    constraint: TokenConstraint | None = field(default=None, init=False, repr=False)
    """The matcher its output is held to (structured output); None: unconstrained."""

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        self.generator = np.random.Generator(np.random.PCG64(self.sampling_params.seed))

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.all_token_ids)

    @property
    def max_total_tokens(self) -> int:
        """The most tokens this request can ever hold: its prompt plus max_tokens."""
        return len(self.prompt_token_ids) + self.sampling_params.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
