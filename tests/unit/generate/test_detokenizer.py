"""Incremental detokenization on a byte-level BPE trained here, and stop strings."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from tensord.generate.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from tests.unit.generate.helpers import byte_level_bpe

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, façade, résumé, über, smörgåsbord.",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji: 😀 🎉 🚀 👩‍💻 and flags 🇫🇷.",
    "Hello world! Hello again, world.",
] * 4

TEXTS = [
    "Hello world, the café is naïve 😀!",
    "東京の🚀は首都です",
    "👩‍💻🇫🇷 über façade",
    "plain ascii text only",
    "日本 résumé 🎉🎉 smörgåsbord",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """A small byte-level BPE: with ~300 tokens, most multibyte characters stay split."""
    return byte_level_bpe(CORPUS, 300)


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.update([token]) for token in ids]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_full_decode_and_never_split_a_character(
    tokenizer: Tokenizer, text: str
) -> None:
    ids = tokenizer.encode(text).ids
    deltas = stream(IncrementalDetokenizer(tokenizer, []), ids)
    assert "".join(deltas) == text == tokenizer.decode(ids)
    assert all("\ufffd" not in delta for delta in deltas)
    for delta in deltas:
        delta.encode("utf-8")  # a lone surrogate would raise here


def test_multibyte_characters_really_are_split_across_tokens(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🚀").ids
    assert len(ids) > 1
    assert tokenizer.decode(ids[:1]) == "\ufffd"
    assert stream(IncrementalDetokenizer(tokenizer, []), ids) == [""] * (len(ids) - 1) + ["🚀"]


def test_output_continues_the_prompt(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("Hello").ids
    output = tokenizer.encode(" world! über 東京").ids
    deltas = stream(IncrementalDetokenizer(tokenizer, prompt), output)
    assert "".join(deltas) == " world! über 東京"
    whole = tokenizer.decode(prompt + output)
    assert whole == "Hello" + "".join(deltas)


def test_special_tokens_are_skipped(tokenizer: Tokenizer) -> None:
    eos = tokenizer.token_to_id("<eos>")
    ids = [*tokenizer.encode("done").ids, eos]
    detok = IncrementalDetokenizer(tokenizer, [])
    assert "".join(stream(detok, ids)) + detok.flush() == "done"


def test_an_unfinished_character_is_flushed_as_a_full_decode_shows_it(
    tokenizer: Tokenizer,
) -> None:
    ids = tokenizer.encode("ok 😀").ids
    cut = ids[:-1]  # the emoji's last byte never came
    detok = IncrementalDetokenizer(tokenizer, [])
    held = "".join(stream(detok, cut))
    assert held == "ok"  # the space shares a token with the emoji's first byte
    assert held + detok.flush() == tokenizer.decode(cut)
    assert tokenizer.decode(cut).endswith("\ufffd")


def test_batches_of_tokens_give_the_same_text(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXTS[0]).ids
    detok = IncrementalDetokenizer(tokenizer, [])
    text = "".join(detok.update(ids[i : i + 3]) for i in range(0, len(ids), 3))
    assert text == TEXTS[0]


def feed_all(matcher: StopStringMatcher, pieces: list[str]) -> tuple[list[str], str | None]:
    emitted = []
    for piece in pieces:
        text, matched = matcher.feed(piece)
        emitted.append(text)
        if matched is not None:
            return emitted, matched
    emitted.append(matcher.flush())
    return emitted, None


def test_a_stop_string_across_chunks_is_never_emitted() -> None:
    matcher = StopStringMatcher(["END", "\n\n"])
    emitted, matched = feed_all(matcher, ["Hello E", "N", "D tail"])
    assert matched == "END"
    assert emitted == ["Hello ", "", ""]
    assert "".join(emitted) == "Hello "


def test_held_text_is_released_when_it_is_not_a_stop() -> None:
    matcher = StopStringMatcher(["END"])
    emitted, matched = feed_all(matcher, ["an E", "N", "X and E", "ND"])
    assert matched == "END"
    assert emitted == ["an ", "", "ENX and ", ""]


def test_the_earliest_stop_wins_and_text_after_it_is_dropped() -> None:
    matcher = StopStringMatcher(["world", "lo w"])
    emitted, matched = feed_all(matcher, ["hello world"])
    assert (emitted, matched) == (["hel"], "lo w")


def test_no_stop_flushes_what_was_held() -> None:
    matcher = StopStringMatcher(["</s>"])
    emitted, matched = feed_all(matcher, ["a <", "/"])
    assert matched is None
    assert emitted == ["a ", "", "</"]


def test_stop_strings_with_multibyte_text() -> None:
    matcher = StopStringMatcher(["東京", "🚀!"])
    emitted, matched = feed_all(matcher, ["北京 東", "京 more"])
    assert (emitted, matched) == (["北京 ", ""], "東京")
    matcher = StopStringMatcher(["🚀!"])
    assert feed_all(matcher, ["go 🚀", "?", "🚀", "!"]) == (["go ", "🚀?", "", ""], "🚀!")


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        StopStringMatcher(["ok", ""])
