"""The output side of generation: engine outputs in, each request's stream of chunks out.

An engine (in this process, or in the engine process behind a link) hands each step's
`EngineCoreOutput`s to the sink its requests were added with. `OutputStreams` is that
sink where the streams are read: its OutputProcessor detokenizes, matches stop strings
and fills each request's merging slot, and it tells the engine which requests a stop
string ended and which streams were abandoned. It runs on the event loop that reads the
streams, so with frontend processes the per-token text work runs in the frontends, as
vLLM's output processing runs in its API servers.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol

from tokenizers import Tokenizer

from tensord.errors import TensordError
from tensord.generate.core.outputs import EngineCoreOutput, RequestOutput
from tensord.generate.core.sampling_params import ResolvedSamplingParams
from tensord.generate.engine.output_processor import (
    OutputProcessor,
    RequestOutputCollector,
    TokenTimings,
)


class OutputSink(Protocol):
    """Where an engine's outputs for a request go, on the event loop, in order: its token
    outputs (the last one finished), or its end by an error or a passed deadline."""

    def outputs(self, outputs: list[EngineCoreOutput]) -> None:
        """A step's (or several steps') outputs of this sink's requests."""

    def failed(self, request_ids: Sequence[str], error: Exception) -> None:
        """These requests ended with `error` (drain, a failed step, a refused admission: a
        TensordError; or an unexpected failure in the engine process)."""

    def expired(self, request_ids: Sequence[str]) -> None:
        """These requests' deadlines passed before they finished."""


class OutputStreams:
    """Every stream read on this event loop; an OutputSink for the engines they run on.

    `stop(ids)` tells the engines that stop strings ended these requests (they finish at
    the next step); `abort(id)` that nobody reads a request any more."""

    def __init__(
        self,
        stop: Callable[[list[str]], None],
        abort: Callable[[str], None],
    ) -> None:
        self.processor = OutputProcessor()
        self._stop = stop
        self._abort = abort

    def open(
        self,
        request_id: str,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        params: ResolvedSamplingParams,
        arrival_time: float,
        timings: TokenTimings | None = None,
    ) -> RequestOutputCollector:
        """Track a request the engine has just taken; its chunks arrive in the slot."""
        return self.processor.add_request(
            request_id, prompt_token_ids, params, arrival_time, tokenizer=tokenizer,
            timings=timings,
        )  # fmt: skip

    async def stream(
        self, request_id: str, collector: RequestOutputCollector
    ) -> AsyncGenerator[RequestOutput, None]:
        """The request's chunks until the last; a reader that goes away (cancel,
        disconnect, break) aborts the request, which frees its KV cache."""
        finished = False
        try:
            while not finished:
                chunk = await collector.get()
                finished = chunk.finished
                yield chunk
        finally:
            if not finished:
                self.processor.abort_requests([request_id])
                self._abort(request_id)

    def end(self, request_ids: Sequence[str], error: TensordError) -> None:
        """End these streams with `error` now (a drain) and abort their requests."""
        self.processor.fail_requests(request_ids, error)
        for request_id in request_ids:
            self._abort(request_id)

    def unstarted(self) -> list[str]:
        """The streams that have had no token yet."""
        return self.processor.unstarted()

    def open_ids(self) -> list[str]:
        """Every stream still open."""
        return list(self.processor.request_states)

    # -- OutputSink --------------------------------------------------------------------

    def outputs(self, outputs: list[EngineCoreOutput]) -> None:
        to_stop = self.processor.process_outputs(outputs)
        if to_stop:
            self._stop(to_stop)

    def failed(self, request_ids: Sequence[str], error: Exception) -> None:
        self.processor.fail_requests(request_ids, error)

    def expired(self, request_ids: Sequence[str]) -> None:
        self.processor.expire_requests(request_ids)
