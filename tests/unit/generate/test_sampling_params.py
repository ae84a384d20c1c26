"""Sampling parameters: defaults from generation_config, and refusals that name the field."""

from __future__ import annotations

import grpc
import pytest

from tensord.errors import InvalidArgumentError
from tensord.generate.core.request import Request, RequestStatus
from tensord.generate.core.sampling_params import GenerationDefaults, SamplingParams
from tensord.generate.model.hf_config import FileDefaults, JsonFile, read_generation_defaults

DEFAULTS = GenerationDefaults(temperature=0.7, top_p=0.9, eos_token_ids=(2, 7))


def resolve(params: SamplingParams, prompt_len: int = 10, **kw: int) -> object:
    return params.resolve(DEFAULTS, prompt_len=prompt_len, max_model_len=64, vocab_size=100, **kw)


def test_generation_config_fills_what_the_request_leaves_out() -> None:
    assert DEFAULTS.eos_token_ids == (2, 7)
    resolved = SamplingParams(top_k=5, seed=9).resolve(DEFAULTS, prompt_len=10, max_model_len=64)
    assert resolved.temperature == 0.7
    assert resolved.top_p == 0.9
    assert resolved.top_k == 5
    assert resolved.repetition_penalty == 1.0
    assert resolved.max_tokens == 54  # up to the context
    assert resolved.seed == 9
    assert resolved.eos_token_ids == frozenset({2, 7})
    assert resolved.greedy is False
    assert SamplingParams(temperature=0.0).resolve(DEFAULTS, prompt_len=1, max_model_len=8).greedy


def test_defaults_for_an_empty_generation_config() -> None:
    # The daemon reads generation_config.json with hf_config.read_generation_defaults.
    empty = read_generation_defaults(JsonFile(None, {"eos_token_id": 50256}))
    assert empty == FileDefaults()
    nulls = {"temperature": None, "top_k": None, "max_new_tokens": None, "eos_token_id": None}
    assert read_generation_defaults(JsonFile(None, nulls)) == FileDefaults()
    defaults = GenerationDefaults(eos_token_ids=(50256,))
    resolved = SamplingParams().resolve(defaults, prompt_len=3, max_model_len=16)
    assert (resolved.temperature, resolved.top_k, resolved.top_p) == (1.0, 0, 1.0)


def test_default_max_tokens_is_cut_to_the_room_left() -> None:
    defaults = GenerationDefaults(max_new_tokens=100)
    assert SamplingParams().resolve(defaults, prompt_len=60, max_model_len=64).max_tokens == 4
    assert SamplingParams().resolve(defaults, prompt_len=4, max_model_len=640).max_tokens == 100
    by_length = GenerationDefaults(max_length=20)
    assert SamplingParams().resolve(by_length, prompt_len=5, max_model_len=64).max_tokens == 15
    assert SamplingParams().resolve(by_length, prompt_len=30, max_model_len=64).max_tokens == 1


def test_an_absent_seed_gets_a_random_one() -> None:
    seeds = {
        SamplingParams().resolve(DEFAULTS, prompt_len=1, max_model_len=8).seed for _ in range(4)
    }
    assert len(seeds) == 4
    assert all(0 <= s < 2**64 for s in seeds)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            SamplingParams(temperature=-0.5),
            "sampling.temperature must be >= 0 (0 means greedy), got -0.5",
        ),
        (SamplingParams(temperature=float("nan")), "sampling.temperature must be a finite number"),
        (SamplingParams(top_p=0.0), "sampling.top_p must be in (0, 1], got 0.0"),
        (SamplingParams(top_p=1.5), "sampling.top_p must be in (0, 1], got 1.5"),
        (SamplingParams(top_k=-1), "sampling.top_k must be in [0, 2^31) (0 means no limit)"),
        (SamplingParams(top_k=2**64), "sampling.top_k must be in [0, 2^31)"),
        (
            SamplingParams(repetition_penalty=0.0),
            "sampling.repetition_penalty must be > 0 (1 means none), got 0.0",
        ),
        (SamplingParams(logprobs=21), "sampling.logprobs must be in [0, 20], got 21"),
        (SamplingParams(logprobs=-1), "sampling.logprobs must be in [0, 20], got -1"),
        (SamplingParams(max_tokens=0), "sampling.max_tokens must be >= 1, got 0"),
        (
            SamplingParams(seed=2**64),
            "sampling.seed must be in [0, 2^64), got 18446744073709551616",
        ),
        (SamplingParams(stop=("ok", "")), "sampling.stop[1] is empty; a stop sequence needs text"),
        (
            SamplingParams(stop=tuple(f"s{i}" for i in range(17))),
            "sampling.stop has 17 sequences; at most 16 are allowed",
        ),
        (
            SamplingParams(stop=("ok", "x" * 513)),
            "sampling.stop[1] has 513 characters; at most 512 are allowed",
        ),
        (
            SamplingParams(stop_token_ids=(1,) * 1025),
            "sampling.stop_token_ids has 1025 ids; at most 1024 are allowed",
        ),
        (
            SamplingParams(stop_token_ids=(5, 100)),
            "sampling.stop_token_ids[1] is 100, outside the vocabulary [0, 100)",
        ),
        (
            SamplingParams(max_tokens=55),
            "sampling.max_tokens is 55 and the prompt has 10 tokens: 65 in all, beyond the "
            "model's context of 64 tokens; ask for at most 54 tokens",
        ),
    ],
)
def test_bad_values_are_refused_with_field_value_and_range(
    params: SamplingParams, message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        resolve(params)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.message.startswith(message)


def test_prompt_length_limits() -> None:
    with pytest.raises(InvalidArgumentError, match="the prompt is empty"):
        resolve(SamplingParams(), prompt_len=0)
    with pytest.raises(
        InvalidArgumentError,
        match="the prompt has 64 tokens; the model's context is 64 tokens, so a prompt may "
        "have at most 63",
    ):
        resolve(SamplingParams(), prompt_len=64)
    assert resolve(SamplingParams(max_tokens=1), prompt_len=63).max_tokens == 1  # type: ignore[attr-defined]


def test_logprob_limit_is_the_engines() -> None:
    with pytest.raises(InvalidArgumentError, match=r"must be in \[0, 5\], got 6"):
        resolve(SamplingParams(logprobs=6), max_logprobs=5)


def test_status_ranges_and_finish_reasons() -> None:
    live = [RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED]
    done = [s for s in RequestStatus if s not in live]
    assert [s.is_finished for s in live] == [False] * 3
    assert all(s.is_finished for s in done)
    assert RequestStatus.FINISHED_STOPPED.finish_reason == "stop"
    assert RequestStatus.FINISHED_LENGTH.finish_reason == "length"
    assert RequestStatus.FINISHED_DEADLINE.finish_reason is None


def test_request_tracks_prompt_and_output() -> None:
    resolved = SamplingParams(max_tokens=4, seed=3).resolve(
        DEFAULTS, prompt_len=3, max_model_len=64
    )
    request = Request("r", [5, 6, 7], resolved, arrival_time=1.0)
    request.append_output_token(9)
    assert request.all_token_ids == [5, 6, 7, 9]
    assert (request.num_prompt_tokens, request.num_output_tokens, request.num_tokens) == (3, 1, 4)
    assert request.max_total_tokens == 7
    assert request.prompt_token_ids == [5, 6, 7]
