"""How the RPC decorators record a call that gRPC ended under the handler."""

from __future__ import annotations

from typing import Any

import grpc

from tensord.server.kit.rpc import _cancelled


class Recorded:
    """The servicer's observer: what `finished` was told."""

    def __init__(self) -> None:
        self.codes: list[grpc.StatusCode] = []

    def finished(self, rpc: str, model: str, code: grpc.StatusCode, *rest: Any) -> None:
        self.codes.append(code)


class Servicer:
    def __init__(self) -> None:
        self.observer = Recorded()


class CallState:
    """The two things _cancelled reads of a grpc.aio ServicerContext."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining

    def invocation_metadata(self) -> tuple[()]:
        return ()


def test_a_call_ended_at_its_deadline_is_deadline_exceeded_else_cancelled() -> None:
    servicer = Servicer()
    for remaining in (-0.01, 0.0, 5.0, None):
        _cancelled(servicer, "Predict", object(), 0.0, "rid", CallState(remaining))  # type: ignore[arg-type]
    assert servicer.observer.codes == [
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.CANCELLED,
    ]
