"""Small builders shared by the engine-core unit tests."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tensord.generate.core.request import Request
from tensord.generate.core.sampling_params import ResolvedSamplingParams


def params(**overrides: object) -> ResolvedSamplingParams:
    """Greedy, 16 tokens, eos 0, unless overridden."""
    values: dict[str, object] = {
        "max_tokens": 16,
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "repetition_penalty": 1.0,
        "seed": 1234,
        "eos_token_ids": frozenset({0}),
    }
    values.update(overrides)
    return ResolvedSamplingParams(**values)  # type: ignore[arg-type]


def make_request(
    request_id: str,
    prompt: list[int],
    *,
    arrival: float = 0.0,
    deadline: float | None = None,
    priority: int = 0,
    **sampling: object,
) -> Request:
    return Request(request_id, list(prompt), params(**sampling), arrival, deadline, priority)


def byte_level_bpe(corpus: Iterable[str], vocab_size: int) -> Tokenizer:
    """A small byte-level BPE trained on `corpus` (with an `<eos>` special token): with a
    few hundred tokens, most multibyte characters stay split across tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return tok
