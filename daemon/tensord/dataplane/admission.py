"""Generate admission: one pure function of a request's fields and the generator's row in
the model table, like vLLM's InputProcessor.

Nothing here touches an engine, a tokenizer or the event loop: a frontend process holding
the table could admit requests for an engine in another process. The data plane calls
`admit` and nothing else checks a Generate request: before the request is parsed with
what its bytes say (a prompt certainly too long is never parsed or tokenised), then with
its token ids and sampling parameters (the engine gets the resolved parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensord.errors import InvalidArgumentError
from tensord.generate.core.sampling_params import (
    GenerationDefaults,
    ResolvedSamplingParams,
    SamplingParams,
    check_prompt_length,
)


@dataclass(frozen=True, slots=True)
class GeneratorEntry:
    """A generator's row in the model table: what a Generate request is admitted against."""

    name: str
    max_model_len: int
    """The most tokens (prompt and completion) one sequence may hold."""
    vocab_size: int
    max_token_bytes: int
    """The most UTF-8 bytes one token's text takes: a prompt of B bytes has at least
    B / max_token_bytes tokens."""
    defaults: GenerationDefaults
    """The model's sampling defaults (generation_config.json)."""
    max_prompt_tokens: int = 0
    """The server's [limits] max_prompt_tokens (0: no limit)."""


@dataclass(slots=True)
class GenerateFields:
    """What is known of a Generate request: its sizes before it is parsed; after, also
    its prompt as token ids and its sampling parameters."""

    prompt_bytes: int = 0
    """Bytes of the text prompt."""
    token_ids: int = 0
    """prompt_token_ids given: their number (at least that many when not `exact`)."""
    exact: bool = True
    prompt_token_ids: list[int] | None = None
    """The prompt's token ids (given, or the text tokenised); None before parsing."""
    text: bool = False
    """The request gave a text prompt (which `prompt_token_ids` holds tokenised)."""
    sampling: SamplingParams | None = None


def text_bytes(text: str, what: str = "the prompt") -> int:
    """The UTF-8 size of a text bound for a tokenizer: INVALID_ARGUMENT for one that is
    not Unicode text (a lone surrogate, which JSON's \\ud800 escapes can carry and no
    tokenizer takes)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} is not valid Unicode text: it holds a lone surrogate "
            f"(U+{ord(text[exc.start]):04X}) at character {exc.start}"
        ) from None


def admit(request: GenerateFields, entry: GeneratorEntry) -> ResolvedSamplingParams | None:
    """INVALID_ARGUMENT for a request the generator cannot take; else, once the request is
    parsed, its sampling parameters resolved against the model's defaults and limits."""
    ids = request.prompt_token_ids
    if ids is None:
        _check_sizes(request, entry)
        return None
    if request.text and request.token_ids:
        raise InvalidArgumentError("set one of prompt and prompt_token_ids, not both")
    if not request.text and not request.token_ids:
        raise InvalidArgumentError("the prompt is empty: set prompt (text) or prompt_token_ids")
    if not request.text:
        vocab = entry.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidArgumentError(
                f"prompt_token_ids: {bad[:5]} outside the vocabulary [0, {vocab})"
            )
    _check_prompt_tokens(len(ids), entry)
    sampling = request.sampling or SamplingParams()
    return sampling.resolve(
        entry.defaults,
        prompt_len=len(ids),
        max_model_len=entry.max_model_len,
        vocab_size=entry.vocab_size,
    )


def _check_prompt_tokens(count: int, entry: GeneratorEntry) -> None:
    """A prompt of `count` tokens is within [limits] max_prompt_tokens and the context."""
    limit = entry.max_prompt_tokens
    if limit and count > limit:
        raise InvalidArgumentError(
            f"the prompt has {count} tokens, more than the {limit} this server accepts "
            "([limits] max_prompt_tokens); shorten it"
        )
    check_prompt_length(count, entry.max_model_len)


def _check_sizes(request: GenerateFields, entry: GeneratorEntry) -> None:
    """Before parsing: refuse a prompt that certainly has more tokens than the model
    admits (token ids counted; a text of more bytes than that many of the vocabulary's
    longest tokens)."""
    context = entry.max_model_len
    limit = min(context - 1, entry.max_prompt_tokens or context)
    setting = (
        "[limits] max_prompt_tokens"
        if entry.max_prompt_tokens and entry.max_prompt_tokens < context
        else f"the model's context of {context} tokens"
    )
    if request.token_ids and request.exact:
        _check_prompt_tokens(request.token_ids, entry)
    elif request.token_ids > limit:
        raise InvalidArgumentError(
            f"prompt_token_ids holds at least {request.token_ids} tokens: more than the "
            f"{limit} a prompt may have ({setting}); shorten it"
        )
    widest = entry.max_token_bytes
    fewest = -(-request.prompt_bytes // widest)  # the fewest tokens a text that long can be
    if fewest > limit:
        raise InvalidArgumentError(
            f"the prompt takes {request.prompt_bytes} bytes, so it has at least {fewest} "
            f"tokens (no token of model {entry.name!r} stands for more than {widest} "
            f"bytes): more than the {limit} a prompt may have ({setting}); shorten it"
        )
