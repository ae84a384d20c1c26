"""Generate admission: one pure function of the request's fields and the model's entry."""

from __future__ import annotations

import pytest

from tensord.dataplane.admission import GenerateFields, GeneratorEntry, admit
from tensord.errors import InvalidArgumentError
from tensord.generate.core.sampling_params import GenerationDefaults, SamplingParams

ENTRY = GeneratorEntry("llm", 64, 100, 4, GenerationDefaults(max_new_tokens=8), 0)


def refusal(fields: GenerateFields, entry: GeneratorEntry = ENTRY) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        admit(fields, entry)
    return info.value.message


def test_before_parsing_only_sizes_are_checked() -> None:
    assert admit(GenerateFields(prompt_bytes=252, token_ids=63), ENTRY) is None
    assert refusal(GenerateFields(prompt_bytes=253)) == (
        "the prompt takes 253 bytes, so it has at least 64 tokens (no token of model 'llm' "
        "stands for more than 4 bytes): more than the 63 a prompt may have (the model's "
        "context of 64 tokens); shorten it"
    )
    assert refusal(GenerateFields(token_ids=70, exact=False)) == (
        "prompt_token_ids holds at least 70 tokens: more than the 63 a prompt may have "
        "(the model's context of 64 tokens); shorten it"
    )
    limited = GeneratorEntry("llm", 64, 100, 4, GenerationDefaults(), 10)
    assert refusal(GenerateFields(token_ids=11), limited) == (
        "the prompt has 11 tokens, more than the 10 this server accepts "
        "([limits] max_prompt_tokens); shorten it"
    )


def test_after_parsing_the_prompt_and_sampling_resolve() -> None:
    resolved = admit(GenerateFields(token_ids=3, prompt_token_ids=[1, 2, 3]), ENTRY)
    assert resolved is not None and resolved.max_tokens == 8
    tokenised = GenerateFields(prompt_token_ids=[5], text=True, sampling=SamplingParams(7))
    resolved = admit(tokenised, ENTRY)
    assert resolved is not None and resolved.max_tokens == 7
    both = GenerateFields(token_ids=1, prompt_token_ids=[1], text=True)
    assert refusal(both) == "set one of prompt and prompt_token_ids, not both"
    assert refusal(GenerateFields(prompt_token_ids=[])) == (
        "the prompt is empty: set prompt (text) or prompt_token_ids"
    )
    assert refusal(GenerateFields(token_ids=2, prompt_token_ids=[1, 100])) == (
        "prompt_token_ids: [100] outside the vocabulary [0, 100)"
    )
    assert refusal(GenerateFields(prompt_token_ids=[], text=True)) == (
        "the prompt is empty: give at least one token"
    )


def test_text_bytes_are_utf8_and_refuse_lone_surrogates() -> None:
    from tensord.dataplane.admission import text_bytes

    assert text_bytes("") == 0
    assert text_bytes("héllo €") == 10
    with pytest.raises(InvalidArgumentError) as caught:
        text_bytes("ab\ud800c", "the conversation")
    assert caught.value.message == (
        "the conversation is not valid Unicode text: it holds a lone surrogate (U+D800) at "
        "character 2"
    )
