"""What one scheduling step hands the model runner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tensord.generate.core.request import Request


@dataclass(slots=True, frozen=True)
class ScheduledRequest:
    """One request's share of a step.

    The runner feeds `token_ids` at positions start_pos.., after the `start_pos` tokens
    whose keys and values its block table already holds, writes the new keys and values
    into the table's blocks, and samples a token from the last position when `sample`
    is set (a prefill chunk that does not reach the end of the prompt samples nothing).
    """

    request_id: str
    token_ids: Sequence[int]
    start_pos: int
    """Tokens already computed: the position of token_ids[0]."""
    block_ids: Sequence[int]
    """The block table: block j holds positions [j*block_size, (j+1)*block_size)."""
    sample: bool = True
    request: Request | None = None
    """The request itself, for the sampler (read only: the scheduler owns its state); None
    in steps run without a scheduler (the load-time layout check and warm-up)."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Tokens in the KV cache once this step has run."""
        return self.start_pos + len(self.token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    """A step: the requests to run, and what changed since the previous step."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)
    """Requests that lost their blocks this step; they recompute later."""
    finished_req_ids: set[str] = field(default_factory=set)
    """Every request that finished or was aborted since the previous step (the runner drops
    any state it keeps for them)."""
    expired_req_ids: list[str] = field(default_factory=list)
    """Requests this step finished because their deadline passed (FINISHED_DEADLINE)."""

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(len(item.token_ids) for item in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
