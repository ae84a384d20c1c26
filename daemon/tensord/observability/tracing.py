"""OpenTelemetry tracing (the optional `otel` extra): one server span per RPC.

A span is recorded when the call ends, with the call's real start time, and is parented to
the caller's W3C `traceparent` metadata when there is one. Spans are batched and exported
over OTLP/gRPC on the SDK's own thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from tensord.config_tables import TracingSettings

log = structlog.get_logger("tensord.tracing")

SERVICE = "tensord.v1.InferenceService"
KSERVE_SERVICE = "inference.GRPCInferenceService"
"""The Open Inference Protocol's service: every RPC not of tensord.v1's is one of its."""
_SERVICE_RPCS = frozenset({"Predict", "Generate", "Health", "Info"})
# Per OpenTelemetry's gRPC conventions, these server-side codes mark a span as an error;
# the others are the caller's doing.
_ERROR_CODES = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


@dataclass(slots=True, frozen=True)
class HttpExchange:
    """An HTTP request's part of its span (the OpenAI-compatible API): the method, the
    route, the response's status."""

    method: str
    route: str
    status: int


class RpcTracer:
    """Records a span per RPC through its own TracerProvider (the global one is untouched)."""

    def __init__(self, settings: TracingSettings, exporter: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporter = (
                OTLPSpanExporter(endpoint=settings.otlp_endpoint)
                if settings.otlp_endpoint
                else OTLPSpanExporter()
            )
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("tensord")
        self._propagator = TraceContextTextMapPropagator()
        self._kind = trace.SpanKind.SERVER
        self._status = trace.Status
        self._error = trace.StatusCode.ERROR

    def record(
        self,
        rpc: str,
        model: str,
        code: Any,
        elapsed_s: float,
        request_id: str,
        metadata: Sequence[tuple[str, Any]] | None,
        message: str = "",
        http: HttpExchange | None = None,
    ) -> None:
        """One finished call: `code` is a grpc.StatusCode, `elapsed_s` its duration;
        `metadata` the gRPC metadata or HTTP headers (a `traceparent` there is the
        parent); `http` for a call that came over HTTP, named and marked by HTTP's
        conventions instead of gRPC's."""
        end = time.time_ns()
        carrier = {k.lower(): v for k, v in metadata or () if isinstance(v, str)}
        parent = self._propagator.extract(carrier) if "traceparent" in carrier else None
        attributes: dict[str, str | int]
        if http is None:
            service = SERVICE if rpc in _SERVICE_RPCS else KSERVE_SERVICE
            name = f"{service}/{rpc}"
            attributes = {
                "rpc.system": "grpc",
                "rpc.service": service,
                "rpc.method": rpc,
                "rpc.grpc.status_code": int(code.value[0]),
            }
            error = code.name in _ERROR_CODES
        else:  # OpenTelemetry's HTTP server conventions: 5xx is the server's failure
            name = f"{http.method} {http.route}"
            attributes = {
                "http.request.method": http.method,
                "http.route": http.route,
                "http.response.status_code": http.status,
                "url.scheme": "http",
                "tensord.status": code.name,
            }
            error = http.status >= 500 or code.name in _ERROR_CODES  # also mid-stream
        attributes["tensord.request_id"] = request_id
        if model:
            attributes["tensord.model"] = model
        span = self._tracer.start_span(
            name,
            context=parent,
            kind=self._kind,
            attributes=attributes,
            start_time=end - int(elapsed_s * 1e9),
        )
        if error:
            span.set_status(self._status(self._error, f"{code.name}: {message}"))
        span.end(end_time=end)

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporter."""
        self._provider.shutdown()


def build_tracer(settings: TracingSettings, exporter: Any = None) -> RpcTracer | None:
    """A tracer when tracing is enabled and the `otel` extra is installed; None otherwise,
    with a log line saying why when it was asked for."""
    if not settings.enabled:
        return None
    try:
        tracer = RpcTracer(settings, exporter)
    except ImportError as exc:
        log.warning(
            "tracing.unavailable",
            reason=f"OpenTelemetry is not installed ({exc.name or exc}); "
            'install the otel extra from the clone: pip install -e ".[otel]"',
        )
        return None
    log.info(
        "tracing.enabled",
        service_name=settings.service_name,
        otlp_endpoint=settings.otlp_endpoint or "(exporter default)",
        sample_ratio=settings.sample_ratio,
    )
    return tracer
