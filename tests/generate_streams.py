"""Greedy Generate streams against a running server, for the tests that compare tokens:
one stream's tokens, a model's Info, and streams started in waves."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


def greedy_tokens(
    client: Any, model: str, prompt: Sequence[int], new_tokens: int, first: threading.Event
) -> list[int]:
    """One greedy stream's tokens (ignore_eos); `first` is set at its first chunk."""
    tokens: list[int] = []
    for chunk in client.generate(
        model, token_ids=list(prompt), max_tokens=new_tokens, temperature=0, ignore_eos=True
    ):
        tokens.extend(chunk.token_ids)
        first.set()
    return tokens


def model_status(client: Any, name: str) -> Any:
    """The model's ModelInfo as Info reports it."""
    (model,) = [m for m in client.info().models if m.name == name]
    return model


def in_waves(
    client: Any,
    model: str,
    requests: Sequence[tuple[Sequence[int], int]],
    wave_sizes: Sequence[int],
) -> list[list[int]]:
    """Each (prompt, new tokens) request as a greedy stream, started wave by wave (a wave
    starts once every stream before it has its first token); each stream's tokens."""
    assert sum(wave_sizes) == len(requests), (wave_sizes, len(requests))
    results: list[list[int]] = [[] for _ in requests]
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    index = 0
    for size in wave_sizes:
        started = []
        for i in range(index, index + size):
            first = threading.Event()

            def run(i: int = i, first: threading.Event = first) -> None:
                try:
                    prompt, new_tokens = requests[i]
                    results[i] = greedy_tokens(client, model, prompt, new_tokens, first)
                except BaseException as exc:  # reported below
                    errors.append(exc)
                    first.set()

            thread = threading.Thread(target=run)
            thread.start()
            threads.append(thread)
            started.append(first)
        index += size
        for first in started:
            assert first.wait(30), "a stream produced no token in 30 s"
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results
