"""The output processor: engine-core outputs in, stream chunks out, one slot per request.

For every step's `EngineCoreOutput`s it detokenizes the new tokens (each request with its
model's tokenizer), matches stop strings on the text (returning the requests a stop string
ended, for the engine to finish), and puts a `RequestOutput` into the request's
`RequestOutputCollector`. The data plane's OutputStreams (streams.py) holds one, in
whichever process reads the streams (a frontend, with frontend processes). The collector
holds at most one pending chunk: when the reader is slower than the engine, new chunks
merge into it (token ids, text and logprobs appended), so memory stays bounded whatever
the reader does. The last chunk carries the finish reason and usage.

Everything here runs on the event loop's thread: `put` wakes the reader through an
asyncio.Event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenizers import Tokenizer

from tensord.errors import DeadlineExceededError, InternalError, TensordError
from tensord.generate.core.outputs import EngineCoreOutput, RequestOutput, Usage
from tensord.generate.core.request import RequestStatus
from tensord.generate.core.sampling_params import ResolvedSamplingParams
from tensord.generate.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher


class RequestOutputCollector:
    """One request's merging output slot between the engine loop and its stream.

    Chunks that arrive while the reader is away merge into one, so a slow reader holds at
    most two: the first chunk always goes alone (it is the time to first token, whatever
    the reader's pace), everything after it merges into the second."""

    def __init__(self) -> None:
        self._pending: list[RequestOutput] = []
        self._taken_first = False
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, output: RequestOutput) -> None:
        """Hand over a chunk, merging it into the last one not yet taken (never the first)."""
        pending = self._pending
        if not pending or (len(pending) == 1 and not self._taken_first):
            pending.append(output)
        else:
            pending[-1].merge(output)
        self._ready.set()

    def put_error(self, error: BaseException) -> None:
        """End the stream with an error, after the chunks not yet taken (if any)."""
        self._error = error
        self._ready.set()

    async def get(self) -> RequestOutput:
        """The next chunk (all that arrived since the last get), waiting for one."""
        while (output := self.get_nowait()) is None:
            await self._ready.wait()
        return output

    def get_nowait(self) -> RequestOutput | None:
        """The next pending chunk, or None; raises the stream's error once nothing is
        pending."""
        pending = self._pending
        if pending:
            output = pending.pop(0)
            self._taken_first = True
            if not pending and self._error is None:
                self._ready.clear()
            return output
        if self._error is not None:
            raise self._error
        self._ready.clear()
        return None


class TokenTimings(Protocol):
    """Where a model's token timings go besides each stream's Usage (the Prometheus
    histograms): the same measurement, from the moment the server received the request."""

    def first_token(self, seconds: float) -> None:
        """A request's first token came `seconds` after the request arrived."""

    def inter_token(self, seconds: float, tokens: int) -> None:
        """`tokens` more tokens came, each `seconds` after the one before (on average)."""


@dataclass(slots=True, eq=False)
class RequestState:
    """What the output processor keeps for one live request."""

    request_id: str
    num_prompt_tokens: int
    arrival_time: float
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopStringMatcher | None
    collector: RequestOutputCollector
    logprobs: bool
    timings: TokenTimings | None = None
    num_output_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None

    def usage(self) -> Usage:
        first = self.first_token_time if self.first_token_time is not None else self.arrival_time
        last = self.last_token_time if self.last_token_time is not None else first
        gaps = self.num_output_tokens - 1
        return Usage(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=self.num_output_tokens,
            time_to_first_token_ms=(first - self.arrival_time) * 1e3,
            mean_inter_token_ms=(last - first) * 1e3 / gaps if gaps > 0 else 0.0,
        )


class OutputProcessor:
    """Detokenizes, stops on text, and fills each request's output slot. It serves the
    requests of any number of engines: each brings its own tokenizer."""

    def __init__(
        self,
        tokenizer: Tokenizer | None = None,
        clock: Callable[[], float] = time.monotonic,
        timings: TokenTimings | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        """The tokenizer of requests added without one."""
        self._clock = clock
        self.request_states: dict[str, RequestState] = {}
        self.timings = timings
        """Told the token timings of requests added without their own, or None."""

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: ResolvedSamplingParams,
        arrival_time: float,
        *,
        tokenizer: Tokenizer | None = None,
        timings: TokenTimings | None = None,
        skip_special_tokens: bool = True,
    ) -> RequestOutputCollector:
        """Start tracking a request; returns the slot its stream reads from. `timings` is
        where its token timings go besides its Usage (the model's histograms)."""
        if request_id in self.request_states:
            raise ValueError(f"request id {request_id!r} is already tracked")
        tokenizer = tokenizer or self.tokenizer
        if tokenizer is None:
            raise ValueError("a request needs a tokenizer: give one, or the processor one")
        state = RequestState(
            request_id=request_id,
            num_prompt_tokens=len(prompt_token_ids),
            arrival_time=arrival_time,
            detokenizer=IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens),
            stop_matcher=StopStringMatcher(params.stop) if params.stop else None,
            collector=RequestOutputCollector(),
            logprobs=params.logprobs > 0,
            timings=timings or self.timings,
        )
        self.request_states[request_id] = state
        return state.collector

    def process_outputs(self, outputs: Iterable[EngineCoreOutput]) -> list[str]:
        """Turn a step's outputs into chunks. Returns the ids of requests that a stop
        string ended and the scheduler still runs: finish them with FINISHED_STOPPED."""
        now = self._clock()
        to_stop = []
        for output in outputs:
            state = self.request_states.get(output.request_id)
            if state is None:
                continue  # aborted while the step ran
            if output.finish_status is not None and output.finish_status.finish_reason is None:
                self.fail_requests([state.request_id], _abnormal_end(output.finish_status))
                continue
            chunk = self._chunk(state, output, now)
            if chunk.finished:
                del self.request_states[state.request_id]
                if not output.finished:
                    to_stop.append(state.request_id)
            state.collector.put(chunk)
        return to_stop

    def fail_requests(self, request_ids: Iterable[str], error: Exception) -> None:
        """End streams with an error (drain, backend failure) after what they already got."""
        for request_id in request_ids:
            state = self.request_states.pop(request_id, None)
            if state is not None:
                state.collector.put_error(error)

    def expire_requests(self, request_ids: Iterable[str]) -> None:
        """End streams whose deadline passed with DEADLINE_EXCEEDED."""
        now = self._clock()
        for request_id in request_ids:
            state = self.request_states.pop(request_id, None)
            if state is not None:
                elapsed_ms = (now - state.arrival_time) * 1e3
                state.collector.put_error(
                    DeadlineExceededError(
                        f"the deadline passed after {elapsed_ms:.1f} ms, with "
                        f"{state.num_output_tokens} tokens generated"
                    )
                )

    def unstarted(self) -> list[str]:
        """The requests that have had no token yet."""
        return [s.request_id for s in self.request_states.values() if not s.num_output_tokens]

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Forget requests whose client went away; nobody reads their slots any more."""
        for request_id in request_ids:
            self.request_states.pop(request_id, None)

    def _chunk(self, state: RequestState, output: EngineCoreOutput, now: float) -> RequestOutput:
        index = state.num_output_tokens
        state.num_output_tokens += len(output.new_token_ids)
        self._time_tokens(state, len(output.new_token_ids), now)
        text = state.detokenizer.update(output.new_token_ids)
        if output.finished:
            text += state.detokenizer.flush()
        finish_reason = output.finish_status.finish_reason if output.finish_status else None
        if state.stop_matcher is not None:
            text, matched = state.stop_matcher.feed(text)
            if matched is not None:
                finish_reason = "stop"
            elif output.finished:
                text += state.stop_matcher.flush()
        chunk = RequestOutput(
            request_id=state.request_id,
            index=index,
            token_ids=list(output.new_token_ids),
            text=text,
            logprobs=list(output.new_logprobs or ()) if state.logprobs else None,
            finish_reason=finish_reason,
        )
        if finish_reason is not None:
            chunk.usage = state.usage()
        return chunk

    def _time_tokens(self, state: RequestState, count: int, now: float) -> None:
        """Stamp `count` new tokens at `now`; tell the metrics the time to the first one
        (from the request's arrival) or the gap per token since the last chunk."""
        first = state.first_token_time is None
        if first:
            state.first_token_time = now
        last, state.last_token_time = state.last_token_time, now
        timings = state.timings
        if timings is None or count <= 0:
            return
        if first or last is None:
            timings.first_token(now - state.arrival_time)
        else:
            timings.inter_token((now - last) / count, count)


def _abnormal_end(status: RequestStatus) -> TensordError:
    """The stream error for an end that is neither a stop nor a length."""
    if status == RequestStatus.FINISHED_DEADLINE:
        return DeadlineExceededError("the deadline passed while the request was generating")
    return InternalError(f"generation ended with {status.name}")
