"""The output processor and its merging slots: chunks, stops on text, usage, errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from tokenizers import Tokenizer

from tensord.errors import DeadlineExceededError, InternalError, UnavailableError
from tensord.generate.core.outputs import EngineCoreOutput, RequestOutput, TokenLogprob, Usage
from tensord.generate.core.request import Request, RequestStatus
from tensord.generate.engine.output_processor import OutputProcessor, RequestOutputCollector
from tests.unit.generate.helpers import byte_level_bpe, make_request


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return byte_level_bpe(["stop here. STOP there. 東京 😀 café"] * 5, 280)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def everything(slot: RequestOutputCollector) -> RequestOutput | None:
    """All the chunks waiting in a slot, as one (a reader that never came)."""
    merged = slot.get_nowait()
    while merged is not None and (later := slot.get_nowait()) is not None:
        merged.merge(later)
    return merged


def track(processor: OutputProcessor, request: Request) -> RequestOutputCollector:
    """Start tracking `request` as the data plane does, with the processor's tokenizer."""
    return processor.add_request(
        request.request_id,
        request.prompt_token_ids,
        request.sampling_params,
        request.arrival_time,
    )


def lp(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.25, ((token, -0.25),))


class Timings:
    """What the metrics would be told."""

    def __init__(self) -> None:
        self.first: list[float] = []
        self.gaps: list[tuple[float, int]] = []

    def first_token(self, seconds: float) -> None:
        self.first.append(seconds)

    def inter_token(self, seconds: float, tokens: int) -> None:
        self.gaps.append((seconds, tokens))


def test_metrics_get_the_timings_usage_reports() -> None:
    tokenizer = byte_level_bpe(["abc abc abc"] * 5, 270)
    clock, timings = Clock(), Timings()
    processor = OutputProcessor(tokenizer, clock, timings)
    slot = track(processor, make_request("r", [1, 2], arrival=99.75))
    for now, tokens, status in [
        (100.0, [3], None),
        (100.25, [4, 5], None),
        (100.5, [6], RequestStatus.FINISHED_LENGTH),
    ]:
        clock.now = now
        processor.process_outputs([EngineCoreOutput("r", tokens, status, None, None)])
    usage = everything(slot)
    assert usage is not None and usage.usage is not None
    assert timings.first == [0.25]
    assert timings.gaps == [(0.125, 2), (0.25, 1)]
    assert usage.usage.time_to_first_token_ms == pytest.approx(timings.first[0] * 1e3)
    gaps = [seconds for seconds, n in timings.gaps for _ in range(n)]
    assert usage.usage.mean_inter_token_ms == pytest.approx(sum(gaps) / len(gaps) * 1e3)


def test_chunks_merge_while_the_reader_is_away_but_the_first_goes_alone() -> None:
    slot = RequestOutputCollector()
    slot.put(RequestOutput("r", 0, [5], "a", [lp(5)]))
    slot.put(RequestOutput("r", 1, [6, 7], "bc", [lp(6), lp(7)]))
    usage = Usage(3, 4, 12.0, 2.0)
    slot.put(RequestOutput("r", 3, [8], "d", [lp(8)], "length", usage))
    assert slot.get_nowait() == RequestOutput("r", 0, [5], "a", [lp(5)])
    merged = slot.get_nowait()
    assert merged == RequestOutput("r", 1, [6, 7, 8], "bcd", [lp(6), lp(7), lp(8)], "length", usage)
    assert slot.get_nowait() is None


def test_after_the_first_chunk_everything_pending_merges_into_one() -> None:
    slot = RequestOutputCollector()
    slot.put(RequestOutput("r", 0, [1], "x"))
    assert slot.get_nowait() is not None
    for i in range(2, 6):
        slot.put(RequestOutput("r", i - 1, [i], "y"))
    merged = slot.get_nowait()
    assert merged is not None
    assert (merged.index, merged.token_ids, merged.text) == (1, [2, 3, 4, 5], "yyyy")
    assert slot.get_nowait() is None


async def test_a_waiting_reader_wakes_on_the_first_chunk() -> None:
    slot = RequestOutputCollector()
    reader = asyncio.create_task(slot.get())
    await asyncio.sleep(0)
    assert not reader.done()
    slot.put(RequestOutput("r", 0, [1], "x"))
    assert (await asyncio.wait_for(reader, 1)).token_ids == [1]
    slot.put(RequestOutput("r", 1, [2], "y"))
    slot.put(RequestOutput("r", 2, [3], "z"))
    second = await asyncio.wait_for(slot.get(), 1)
    assert (second.index, second.token_ids, second.text) == (1, [2, 3], "yz")


async def test_an_error_comes_after_the_pending_chunks() -> None:
    slot = RequestOutputCollector()
    slot.put(RequestOutput("r", 0, [1], "x"))
    slot.put(RequestOutput("r", 1, [2], "y"))
    slot.put_error(UnavailableError("the server is draining"))
    assert (await slot.get()).token_ids == [1]
    assert (await slot.get()).token_ids == [2]
    with pytest.raises(UnavailableError, match="draining"):
        await slot.get()
    with pytest.raises(UnavailableError):
        slot.get_nowait()


def core(rid: str, token: int, status: RequestStatus | None = None) -> EngineCoreOutput:
    return EngineCoreOutput(rid, [token], status)


def test_stream_text_usage_and_timing(tokenizer: Tokenizer) -> None:
    clock = Clock()
    processor = OutputProcessor(tokenizer, clock)
    request = make_request("r", tokenizer.encode("stop").ids, arrival=99.9, logprobs=1)
    slot = track(processor, request)
    ids = tokenizer.encode(" 東京 😀").ids
    chunks = []
    for n, token in enumerate(ids):
        clock.now = 100.0 + 0.01 * n
        last = n == len(ids) - 1
        status = RequestStatus.FINISHED_LENGTH if last else None
        output = EngineCoreOutput("r", [token], status, None, [lp(token)])
        assert processor.process_outputs([output]) == []
        chunk = slot.get_nowait()
        assert chunk is not None
        chunks.append(chunk)
    assert "".join(c.text for c in chunks) == " 東京 😀"
    assert [c.index for c in chunks] == list(range(len(ids)))
    assert [c.token_ids for c in chunks] == [[t] for t in ids]
    assert chunks[0].logprobs == [lp(ids[0])]
    assert [c.finish_reason for c in chunks] == [None] * (len(ids) - 1) + ["length"]
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (request.num_prompt_tokens, len(ids))
    assert usage.time_to_first_token_ms == pytest.approx(100.0)
    assert usage.mean_inter_token_ms == pytest.approx(10.0)
    assert processor.request_states == {}


def test_a_stop_string_ends_the_request_and_is_not_emitted(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer, Clock())
    request = make_request("r", [1], stop=("STOP",))
    slot = track(processor, request)
    ids = tokenizer.encode("stop here. STOP there.").ids
    stopped: list[str] = []
    for token in ids:
        stopped = processor.process_outputs([core("r", token)])
        if stopped:
            break
    assert stopped == ["r"]
    chunk = everything(slot)
    assert chunk is not None
    assert chunk.text == "stop here. "
    assert chunk.finish_reason == "stop"
    assert chunk.usage is not None and chunk.usage.completion_tokens == len(chunk.token_ids)
    assert chunk.token_ids == ids[: len(chunk.token_ids)]
    # a late output for the finished request is ignored
    assert processor.process_outputs([core("r", 5)]) == []


def test_a_held_back_stop_prefix_is_released_at_the_end(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer, Clock())
    slot = track(processor, make_request("r", [1], stop=("here and",)))
    ids = tokenizer.encode("stop here").ids
    for token in ids[:-1]:
        processor.process_outputs([core("r", token)])
    processor.process_outputs([core("r", ids[-1], RequestStatus.FINISHED_STOPPED)])
    chunk = everything(slot)
    assert chunk is not None
    assert (chunk.text, chunk.finish_reason) == ("stop here", "stop")


def test_deadline_drain_and_abort(tokenizer: Tokenizer) -> None:
    clock = Clock()
    processor = OutputProcessor(tokenizer, clock)
    slots = {rid: track(processor, make_request(rid, [1], arrival=99.5)) for rid in "abc"}
    processor.process_outputs([core("a", 10), core("b", 11), core("c", 12)])
    processor.expire_requests(["a", "zzz"])
    processor.fail_requests(["b"], UnavailableError("the server is draining"))
    processor.abort_requests(["c"])
    assert processor.request_states == {}
    assert slots["a"].get_nowait() is not None
    with pytest.raises(DeadlineExceededError) as caught:
        slots["a"].get_nowait()
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.message == "the deadline passed after 500.0 ms, with 1 tokens generated"
    assert slots["b"].get_nowait() is not None
    with pytest.raises(UnavailableError):
        slots["b"].get_nowait()
    with pytest.raises(ValueError, match="already tracked"):
        track(processor, make_request("d", [1]))
        track(processor, make_request("d", [1]))


def test_abnormal_ends_from_the_engine_become_stream_errors(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer, Clock())
    error_slot = track(processor, make_request("e", [1]))
    late_slot = track(processor, make_request("d", [1]))
    processor.process_outputs(
        [
            EngineCoreOutput("e", [], RequestStatus.FINISHED_ERROR),
            EngineCoreOutput("d", [], RequestStatus.FINISHED_DEADLINE),
        ]
    )
    with pytest.raises(InternalError, match="generation ended with FINISHED_ERROR"):
        error_slot.get_nowait()
    with pytest.raises(DeadlineExceededError):
        late_slot.get_nowait()
    assert processor.request_states == {}
