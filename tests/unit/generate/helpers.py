"""Small builders shared by the engine-core unit tests."""

from __future__ import annotations

from tensord.generate.request import Request
from tensord.generate.sampling_params import ResolvedSamplingParams


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
    **sampling: object,
) -> Request:
    return Request(request_id, list(prompt), params(**sampling), arrival, deadline)
