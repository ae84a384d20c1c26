"""Request limits the data plane and the generation engine apply, in domain terms."""

from __future__ import annotations

from tensord.errors import InvalidArgumentError


def check_prompt_tokens(
    model: str, prompt_tokens: int, max_prompt_tokens: int, context_length: int = 0
) -> None:
    """INVALID_ARGUMENT when a tokenised prompt is too long to admit.

    `max_prompt_tokens` is the server's `[limits] max_prompt_tokens` (0: no limit);
    `context_length` the model's context (0: unknown). A prompt must leave room for at
    least one generated token.
    """
    if max_prompt_tokens and prompt_tokens > max_prompt_tokens:
        raise InvalidArgumentError(
            f"the prompt has {prompt_tokens} tokens, more than the {max_prompt_tokens} this "
            "server accepts ([limits] max_prompt_tokens); shorten it"
        )
    if context_length and prompt_tokens >= context_length:
        raise InvalidArgumentError(
            f"the prompt has {prompt_tokens} tokens, leaving no room to generate in model "
            f"{model!r}'s context of {context_length} tokens; shorten it to at most "
            f"{context_length - 1}"
        )
