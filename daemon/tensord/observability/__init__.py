"""Metrics (Prometheus, on their own HTTP port) and tracing (OpenTelemetry) for one server."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from tensord.config import TensordConfig
from tensord.observability.metrics import GenerationMetrics, Metrics
from tensord.observability.observer import RequestObserver
from tensord.observability.tracing import RpcTracer, build_tracer

if TYPE_CHECKING:
    from tensord.registry.registry import ModelRegistry

log = structlog.get_logger("tensord.metrics")

__all__ = ["GenerationMetrics", "Metrics", "Observability", "RequestObserver"]


def split_listen(listen: str) -> tuple[str, int]:
    """("127.0.0.1", 9464) from "127.0.0.1:9464"; IPv6 hosts lose their brackets."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class Observability:
    """The metrics registry and endpoint, the tracer, and the observer the server calls."""

    def __init__(
        self,
        config: TensordConfig,
        registry: ModelRegistry | None,
        span_exporter: Any = None,
        known_model: Callable[[str], bool] | None = None,
    ) -> None:
        """`registry` is None in a frontend process: its models are the engine's, and
        `known_model` says which names the engine serves."""
        self._config = config
        self.metrics: Metrics | None = None
        if config.metrics.enabled:
            from prometheus_client import ProcessCollector

            from tensord.observability.collectors import GpuMemoryCollector, ModelCollector

            self.metrics = Metrics()
            if registry is not None:
                self.metrics.registry.register(ModelCollector(registry))
            self.metrics.registry.register(GpuMemoryCollector(config.server.cuda_device))
            ProcessCollector(namespace="", registry=self.metrics.registry)
        self.tracer: RpcTracer | None = build_tracer(config.tracing, span_exporter)
        self.observer: RequestObserver | None = None
        if self.metrics is not None or self.tracer is not None:
            self.observer = RequestObserver(
                self.metrics.requests if self.metrics is not None else None,
                self.tracer,
                known_model or (lambda name: registry is not None and name in registry.names()),
            )
        self.port = 0
        self._httpd: Any = None

    @property
    def generation(self) -> GenerationMetrics | None:
        """The generation engine's recorders; None when metrics are off."""
        return self.metrics.generation if self.metrics is not None else None

    def rejected(self, method: str, code: grpc.StatusCode) -> None:
        """Count a call an interceptor refused."""
        if self.observer is not None:
            self.observer.rejected(method, code)

    def gauge(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """A gauge whose value `read()` gives at scrape time."""
        if self.metrics is not None:
            from prometheus_client import Gauge

            Gauge(name, documentation, registry=self.metrics.registry).set_function(read)

    def watch_stream_limit(self, limiter: Any) -> None:
        """Export the Generate stream slots held (nothing when there is no limit)."""
        if limiter is not None:
            self.gauge(
                "tensord_generate_streams_active",
                "Generate streams holding a [limits] max_generate_streams slot.",
                lambda: float(limiter.active),
            )

    def start(self) -> None:
        """Serve /metrics on [metrics] listen (a thread of prometheus_client's)."""
        if self.metrics is None:
            return
        from prometheus_client import start_http_server

        listen = self._config.metrics.listen
        host, port = split_listen(listen)
        try:
            self._httpd, _thread = start_http_server(port, host, registry=self.metrics.registry)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from None
        self.port = int(self._httpd.server_port)
        log.info("metrics.listening", listen=listen, port=self.port, path="/metrics")

    def stop(self) -> None:
        """Stop the endpoint and flush the spans."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self.tracer is not None:
            self.tracer.shutdown()
