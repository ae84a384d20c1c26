"""The records that flow out of the engine core: per-step token outputs and stream chunks."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensord.generate.core.request import RequestStatus


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A sampled token's log probability and the most likely alternatives, best first.

    Both come from the log-softmax of the model's raw logits, before repetition penalty,
    temperature, top-k or top-p (as vLLM reports them by default): they describe the
    model, whatever the request's sampling settings.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """(token id, log probability) pairs, most likely first."""


@dataclass(slots=True)
class EngineCoreOutput:
    """What one step did for one request: the tokens it added and whether it finished."""

    request_id: str
    new_token_ids: list[int]
    finish_status: RequestStatus | None = None
    stop_reason: int | str | None = None
    new_logprobs: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_status is not None


@dataclass(slots=True, frozen=True)
class Usage:
    """A finished generation's counts and timings."""

    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_ms: float
    """From receipt of the request to its first token."""
    mean_inter_token_ms: float
    """Mean time between consecutive tokens; 0 with fewer than two."""


@dataclass(slots=True)
class RequestOutput:
    """One chunk of a request's stream: new token ids, the text they add, and at the end
    the finish reason and usage. Chunks a slow reader has not taken yet merge into one."""

    request_id: str
    index: int
    """Position in the completion of this chunk's first token."""
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    """"stop" or "length" on the last chunk, else None."""
    usage: Usage | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def merge(self, later: RequestOutput) -> None:
        """Append a later chunk of the same request to this one."""
        self.token_ids.extend(later.token_ids)
        self.text += later.text
        if later.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(later.logprobs)
        if later.finish_reason is not None:
            self.finish_reason = later.finish_reason
            self.usage = later.usage
