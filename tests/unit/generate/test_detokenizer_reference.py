"""The incremental detokenizer against the reference algorithm it must reproduce.

`WindowDetokenizer` is the prefix/read-offset algorithm of Text Generation Inference and
vLLM (two decodes of a short window per token), which tensord served with before it used
tokenizers' DecodeStream. Every delta, each step's and the final flush, must be the same
text, and so must what stop strings let out of it: on the demo tokenizer, on the demo
tokenizer as transformers saves it beside every Optimum export, and on a SentencePiece-
style tokenizer with byte fallback (Llama, Mistral, Gemma) and a WordPiece one, over
random token streams (partial characters, special tokens anywhere), with and without
skipping special tokens, after prompts that end inside a character.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tensord.demo.tokenizer import build_tokenizer
from tensord.generate.engine.detokenizer import (
    INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET,
    IncrementalDetokenizer,
    StopStringMatcher,
)

_CORPUS = [
    "Hello world, the café is naïve 😀! It's done; don't stop.",
    "東京の🚀は首都です。北京是中国的首都。",
    "plain ascii text only, again and again: über façade résumé.",
] * 5


class WindowDetokenizer:
    """The reference: decode the window with and without the new token; emit the
    difference once the window no longer ends in U+FFFD."""

    def __init__(self, tokenizer: Tokenizer, prompt: Sequence[int], skip: bool) -> None:
        self.tokenizer, self.skip = tokenizer, skip
        self.ids = list(prompt[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET:])
        self.prefix_offset, self.read_offset = 0, len(self.ids)

    def update(self, new_token_ids: Sequence[int]) -> str:
        text = []
        for token_id in new_token_ids:
            self.ids.append(token_id)
            text.append(self.step(final=False))
        return "".join(text)

    def flush(self) -> str:
        return self.step(final=True)

    def step(self, final: bool) -> str:
        prefix = self.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.decode(self.ids[self.prefix_offset :])
        if len(text) <= len(prefix) or (not final and text.endswith("\ufffd")):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(prefix) :]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip) if ids else ""


def _byte_fallback() -> Tokenizer:
    """SentencePiece-style BPE as Llama's tokenizer.json has it: Metaspace, byte fallback
    (<0xNN> tokens for characters outside the vocabulary), and its decoder sequence."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    specials = ["<unk>", "<s>", "</s>"]
    tok.train_from_iterator(_CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=specials))
    tok.add_tokens([f"<0x{i:02X}>" for i in range(256)])  # ordinary tokens, as in Llama's
    return tok


def _wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[UNK]", "[CLS]", "[SEP]"]
    tok.train_from_iterator(
        _CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials)
    )
    return tok


def _exported_demo(root: Path) -> Tokenizer:
    """The demo tokenizer as transformers saves it beside an export (tests/hf_families.py)."""
    pytest.importorskip("transformers")
    from tests.hf_families import hf_tokenizer

    hf_tokenizer().save_pretrained(root)
    return Tokenizer.from_file(str(root / "tokenizer.json"))


@pytest.fixture(scope="module", params=["demo", "exported-demo", "byte-fallback", "wordpiece"])
def tokenizer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Tokenizer:
    if request.param == "demo":
        return build_tokenizer()
    if request.param == "exported-demo":
        return _exported_demo(tmp_path_factory.mktemp("export"))
    return _byte_fallback() if request.param == "byte-fallback" else _wordpiece()


def _streams(tokenizer: Tokenizer, seed: int, count: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) pairs: random ids (one in eight a special token), and text cut at
    random token boundaries, so prompts and outputs start and end inside characters."""
    rng = random.Random(seed)
    vocab = tokenizer.get_vocab_size()
    specials = [i for i in range(vocab) if tokenizer.id_to_token(i) in _SPECIAL_NAMES]
    text_ids = [tokenizer.encode(text).ids for text in _CORPUS[:3]]
    pairs = []
    for _ in range(count):
        if rng.random() < 0.5:
            ids = [
                rng.choice(specials) if rng.random() < 0.125 else rng.randrange(vocab)
                for _ in range(rng.randrange(2, 41))
            ]
        else:
            ids = list(rng.choice(text_ids))
        cut = rng.randrange(0, min(len(ids), 9))
        pairs.append((ids[:cut], ids[cut:]))
    return pairs


_SPECIAL_NAMES = {"<pad>", "<s>", "</s>", "<unk>", "[UNK]", "[CLS]", "[SEP]"}


def _deltas(detok: IncrementalDetokenizer | WindowDetokenizer, ids: list[int], k: int) -> list[str]:
    """Each update's text (k tokens at a time), then the flush."""
    return [detok.update(ids[i : i + k]) for i in range(0, len(ids), k)] + [detok.flush()]


def _stopped(deltas: list[str], stops: list[str]) -> tuple[list[str], str | None]:
    """What a StopStringMatcher lets out of the deltas, and the stop string it matched."""
    matcher, out = StopStringMatcher(stops), []
    for delta in deltas:
        text, matched = matcher.feed(delta)
        out.append(text)
        if matched is not None:
            return out, matched
    out.append(matcher.flush())
    return out, None


@pytest.mark.parametrize("skip", [True, False])
def test_every_delta_and_stop_equals_the_reference(tokenizer: Tokenizer, skip: bool) -> None:
    rng = random.Random(5)
    for prompt, output in _streams(tokenizer, seed=int(skip), count=300):
        k = rng.choice([1, 1, 1, 3])
        got = _deltas(IncrementalDetokenizer(tokenizer, prompt, skip), output, k)
        want = _deltas(WindowDetokenizer(tokenizer, prompt, skip), output, k)
        assert got == want, (prompt, output, k)
        whole = "".join(want)
        if len(whole) > 4:
            start = rng.randrange(len(whole) - 3)
            stops = [whole[start : start + rng.randrange(1, 4)], "\n\n"]
            assert _stopped(got, stops) == _stopped(want, stops)


def test_the_cases_that_differ_from_a_bare_decode_stream_are_covered(tokenizer: Tokenizer) -> None:
    """The streams above include prompts whose tail ends inside a character (where a bare
    DecodeStream would emit the prompt's own text) on every tokenizer that can make one."""
    tails = [
        WindowDetokenizer(tokenizer, prompt, True).decode(
            prompt[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET:]
        )
        for prompt, _ in _streams(tokenizer, seed=1, count=300)
        if prompt
    ]
    vocab = range(tokenizer.get_vocab_size())
    can_split = any(tokenizer.decode([i]).endswith("\ufffd") for i in vocab)
    assert any(t.endswith("\ufffd") for t in tails) == can_split
