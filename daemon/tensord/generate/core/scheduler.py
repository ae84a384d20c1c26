"""The scheduler: continuous batching over the paged KV cache.

Requests are ranked by (priority, arrival): a lower priority value first, then first
come, first served. Each step (`schedule`):
1. requests whose deadline has passed finish (FINISHED_DEADLINE) and free their blocks;
2. while the first waiting request outranks the last-ranked running one by priority and
   finds no room (seats, KV blocks or a slot), that running request is preempted;
3. every running request gets its next tokens, in rank order: one token for a decode, a
   chunk of its prompt for a prefill in progress. When the pool has no block for one,
   the last-ranked running request is preempted;
4. unless step 3 preempted, waiting requests join in rank order (none overtakes one
   ranked before it), within the step's token budget (`max_num_batched_tokens`) and
   `max_num_seqs`. A prompt longer than the remaining budget is prefilled in chunks
   over several steps (chunked prefill); only the step that reaches its last token
   samples.

A preempted request frees its blocks and goes back to the waiting queue, in its rank, with
its generated tokens; it recomputes them (with its prompt) when it joins again, from the
prefix cache as far as its blocks are still there (the paged pool keeps freed blocks
cached; on KV slots its full blocks are in the host prefix store).

The token budget always leaves one token for each running request after the one being
scheduled, so a long prefill never stops the running sequences from decoding.

After the model ran, `update_from_output` records the sampled tokens and finishes
requests on token-level stops: an end-of-sequence token (unless ignore_eos), a stop token
id, max_tokens or the context length. Stop strings are matched on text by the output
processor, which finishes the request through `finish_requests`.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from tensord.errors import InvalidArgumentError, ResourceExhaustedError
from tensord.generate.core.block_pool import KVCacheBlock
from tensord.generate.core.kv_cache_manager import KVCacheStats
from tensord.generate.core.outputs import EngineCoreOutput, TokenLogprob
from tensord.generate.core.request import Request, RequestStatus
from tensord.generate.core.scheduler_output import ScheduledRequest, SchedulerOutput

log = structlog.get_logger("tensord.generate")


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    """The scheduler's limits."""

    max_model_len: int
    """Most tokens (prompt plus completion) in one sequence."""
    max_num_seqs: int = 32
    """Most requests running (holding KV blocks) at once."""
    max_num_batched_tokens: int = 1024
    """Most tokens computed in one step, prefill and decode together."""
    max_queue_size: int = 256
    """Most requests waiting; more get RESOURCE_EXHAUSTED. 0 means no limit."""

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs}): every running sequence decodes each step"
            )
        if self.max_queue_size < 0:
            raise ValueError(f"max_queue_size must be >= 0, got {self.max_queue_size}")


@dataclass(slots=True, frozen=True)
class SchedulerStats:
    """Queue depths and counters for Info and metrics."""

    num_running: int
    num_waiting: int
    num_preemptions: int
    """Preemptions since start."""
    num_rejected: int
    """Requests refused because the waiting queue was full."""
    kv_cache: KVCacheStats


class KVAllocator(Protocol):
    """What the scheduler asks of the KV cache: the paged KVCacheManager, or the
    SlotManager of fused-attention graphs (one slot per sequence)."""

    @property
    def max_tokens(self) -> int: ...
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]: ...
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> list[KVCacheBlock] | None: ...
    def cache_blocks(self, request: Request) -> None: ...
    def free(self, request: Request) -> None: ...
    def get_block_ids(self, request_id: str) -> list[int]: ...
    def stats(self) -> KVCacheStats: ...
    def has_room(self, num_tokens: int) -> bool: ...


def _rank(request: Request) -> tuple[int, int]:
    return (request.priority, request.arrival_seq)


class Scheduler:
    """Decides, step by step, which requests run and on which tokens."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVAllocator) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        """Ordered by rank (priority, arrival); preempted requests go back to their place."""
        self.running: list[Request] = []
        """Ordered by rank: the last (lowest priority, newest) is the first preempted."""
        self._finished_req_ids: set[str] = set()
        self._arrivals = itertools.count()
        self._num_preemptions = 0
        self._num_rejected = 0

    # -- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request; ResourceExhaustedError when the waiting queue is full."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already queued")
        limit = self.config.max_queue_size
        # Requests that the next step seats are not waiting: free seats do not count.
        seats = max(0, self.config.max_num_seqs - len(self.running))
        if limit and len(self.waiting) >= limit + seats:
            self._num_rejected += 1
            raise ResourceExhaustedError(
                f"the generation queue is full ({limit} requests waiting); retry later, or "
                "raise max_queue_size"
            )
        capacity = self.kv_cache_manager.max_tokens
        needed = min(request.max_total_tokens, self.config.max_model_len)
        if needed > capacity:
            raise InvalidArgumentError(
                f"the prompt ({request.num_prompt_tokens} tokens) plus sampling.max_tokens "
                f"({request.sampling_params.max_tokens}) needs {needed} tokens of KV cache; "
                f"the pool holds {capacity}"
            )
        request.arrival_seq = next(self._arrivals)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        bisect.insort(self.waiting, request, key=_rank)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[str]:
        """Finish requests from outside the step (abort, stop string, error, drain) and free
        their blocks at once. Unknown or already finished ids are skipped; returns the ids
        finished."""
        if not status.is_finished:
            raise ValueError(f"{status.name} is not a finished state")
        done = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self._finish(request, status)
                done.append(request_id)
        return done

    def abort(self, request_ids: Iterable[str]) -> list[str]:
        """Abort requests (client cancel or disconnect): FINISHED_ABORTED, blocks freed."""
        return self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_preemptions=self._num_preemptions,
            num_rejected=self._num_rejected,
            kv_cache=self.kv_cache_manager.stats(),
        )

    # -- one step ------------------------------------------------------------------------

    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Choose this step's requests and tokens, allocating their KV slots."""
        output = SchedulerOutput()
        output.expired_req_ids = self._finish_expired(time.monotonic() if now is None else now)
        self._preempt_for_priority(output)
        preempted = len(output.preempted_req_ids)
        budget = self._schedule_running(output)
        if len(output.preempted_req_ids) == preempted:
            self._schedule_waiting(output, budget)
        output.finished_req_ids = self._finished_req_ids
        self._finished_req_ids = set()
        return output

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int],
        logprobs: Mapping[str, TokenLogprob] | None = None,
    ) -> list[EngineCoreOutput]:
        """Record a finished step: computed tokens, sampled tokens, token-level stops.

        Requests finished while the step ran (aborted) are skipped. Returns one output per
        request that got a token this step, and a FINISHED_ERROR output for a request that
        should have got one but is missing from `sampled_token_ids`.
        """
        outputs = []
        for item in scheduler_output.scheduled:
            request = self.requests.get(item.request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue
            request.num_computed_tokens = item.seq_len
            self.kv_cache_manager.cache_blocks(request)
            if not item.sample:
                continue
            token = sampled_token_ids.get(item.request_id)
            if token is None:  # the runner lost this row: end it rather than stall it
                self._finish(request, RequestStatus.FINISHED_ERROR)
                outputs.append(EngineCoreOutput(item.request_id, [], RequestStatus.FINISHED_ERROR))
                continue
            request.append_output_token(int(token))
            status = self._check_stop(request, int(token))
            if status is not None:
                self._finish(request, status)
            token_logprob = logprobs.get(item.request_id) if logprobs else None
            outputs.append(
                EngineCoreOutput(
                    request.request_id,
                    [int(token)],
                    status,
                    request.stop_reason,
                    None if token_logprob is None else [token_logprob],
                )
            )
        return outputs

    # -- the steps of schedule() ---------------------------------------------------------

    def _finish_expired(self, now: float) -> list[str]:
        expired = [
            request.request_id
            for request in self.requests.values()
            if request.deadline is not None and request.deadline <= now
        ]
        return self.finish_requests(expired, RequestStatus.FINISHED_DEADLINE)

    def _preempt_for_priority(self, output: SchedulerOutput) -> None:
        """Preempt last-ranked running requests while the first waiting one has a lower
        priority value than they do and no room to join."""
        while self.waiting and self.running:
            head, last = self.waiting[0], self.running[-1]
            if last.priority <= head.priority or self._has_room(head):
                return
            self.running.pop()
            self._preempt(last)
            output.preempted_req_ids.append(last.request_id)

    def _has_room(self, request: Request) -> bool:
        """Whether a seat and KV room for the request's first chunk are free now."""
        if len(self.running) >= self.config.max_num_seqs:
            return False
        first = min(request.num_tokens, self.config.max_num_batched_tokens)
        return self.kv_cache_manager.has_room(first)

    def _schedule_running(self, output: SchedulerOutput) -> int:
        """Give each running request its next tokens, preempting the newest when the pool
        is full. Returns the token budget left."""
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running):
            request = self.running[i]
            later = len(self.running) - i - 1
            num_new = min(request.num_tokens - request.num_computed_tokens, budget - later)
            if num_new <= 0:
                i += 1
                continue
            if not self._allocate_or_preempt(request, num_new, output):
                break  # it was the newest and preempted itself: nothing after it runs
            output.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
            i += 1
        return budget

    def _allocate_or_preempt(self, request: Request, num_new: int, output: SchedulerOutput) -> bool:
        while self.kv_cache_manager.allocate_slots(request, num_new) is None:
            victim = self.running.pop()
            self._preempt(victim)
            output.preempted_req_ids.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _schedule_waiting(self, output: SchedulerOutput, budget: int) -> None:
        """Admit waiting requests in arrival order while budget, seats and blocks last."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hits, num_hit = self.kv_cache_manager.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit, budget)
            if self.kv_cache_manager.allocate_slots(request, num_new, hits) is None:
                break  # first come, first served: nobody overtakes the head
            self.waiting.popleft()
            request.num_computed_tokens = num_hit
            request.status = RequestStatus.RUNNING
            bisect.insort(self.running, request, key=_rank)
            output.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new

    def _scheduled(self, request: Request, num_new: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        end = start + num_new
        return ScheduledRequest(
            request_id=request.request_id,
            request=request,
            token_ids=request.all_token_ids[start:end],
            start_pos=start,
            block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
            sample=end == request.num_tokens,
        )

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self._num_preemptions += 1
        bisect.insort(self.waiting, request, key=_rank)
        log.debug(
            "request.preempted",
            request_id=request.request_id,
            tokens=request.num_tokens,
            preemptions=request.num_preemptions,
        )

    # -- finishing -----------------------------------------------------------------------

    def _check_stop(self, request: Request, token: int) -> RequestStatus | None:
        params = request.sampling_params
        if not params.ignore_eos and token in params.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            request.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        if request.constraint is not None and request.constraint.is_stopped():
            return RequestStatus.FINISHED_STOPPED  # the structure is complete
        if (
            request.num_output_tokens >= params.max_tokens
            or request.num_tokens >= self.config.max_model_len
        ):
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self._finished_req_ids.add(request.request_id)
