"""What the server records about each call: Prometheus metrics and a trace span.

The RPC decorators (tensord.server.kit.rpc) call `finished` once per call, the servicer
`predict_timings` for a served Predict, the interceptors `rejected` for calls they refuse.
With metrics and tracing both off the server has no observer and pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tensord.observability.metrics import RequestMetrics
from tensord.observability.tracing import HttpExchange, RpcTracer

# A model label for names the registry does not know: a client cannot mint label values.
UNKNOWN_MODEL = "_unknown"


class RequestObserver:
    """Feeds the request metrics and the tracer; either may be absent."""

    def __init__(
        self,
        metrics: RequestMetrics | None,
        tracer: RpcTracer | None,
        known_model: Callable[[str], bool],
    ) -> None:
        self.metrics = metrics
        self.tracer = tracer
        self._known = known_model

    def finished(
        self,
        rpc: str,
        model: str,
        code: grpc.StatusCode,
        elapsed_s: float,
        request_id: str,
        context: Any = None,
        message: str = "",
        http: tuple[HttpExchange, Sequence[tuple[str, str]]] | None = None,
    ) -> None:
        """One call ended with `code` after `elapsed_s` seconds; `context` is its
        ServicerContext (the tracer reads the caller's traceparent from it); `http` for a
        call over HTTP: its method, route and status, and its headers (instead of
        `context`)."""
        if model and code is not grpc.StatusCode.OK and not self._known(model):
            model = UNKNOWN_MODEL
        if self.metrics is not None:
            self.metrics.finished(rpc, model, code.name, elapsed_s)
        if self.tracer is not None:
            exchange, metadata = http if http is not None else (None, None)
            if context is not None:
                metadata = context.invocation_metadata()
            self.tracer.record(rpc, model, code, elapsed_s, request_id, metadata, message, exchange)

    def predict_timings(self, model: str, queue_s: float, compute_s: float) -> None:
        """Where a served Predict's time went."""
        if self.metrics is not None:
            self.metrics.predict_timings(model, queue_s, compute_s)

    def rejected(self, method: str, code: grpc.StatusCode) -> None:
        """An interceptor refused a call before its handler ran (the model is not known)."""
        service, _, rpc = method.rpartition("/")
        if service.endswith("InferenceService") and self.metrics is not None:
            self.metrics.rejected(rpc, code.name)
