"""OpenTelemetry spans, exported over OTLP/gRPC to a collector the test runs on loopback."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import structlog
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tensord.backends.base import Backend, DeviceOptions
from tensord.config import load_config
from tensord.config_tables import TracingSettings
from tensord.errors import InternalError
from tensord.modelconfig.model import ModelConfig
from tensord.observability.tracing import build_tracer
from tensord.registry.registry import default_backend_factory
from tensord_client import Client
from tensord_client._common import predict_request
from tests.conftest import ServerThread, serve
from tests.models import WrappedBackend

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver that keeps what it is sent."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def Export(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        found = []
        for request in self.requests:
            for rs in request.resource_spans:
                resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                found += [(resource, span) for ss in rs.scope_spans for span in ss.spans]
        return found


def attributes(span: Any) -> dict[str, Any]:
    out = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind)
    return out


def start_collector() -> tuple[Collector, grpc.Server, int]:
    """A Collector served on a free loopback port: (collector, its server, the port)."""
    collector = Collector()
    receiver = grpc.server(ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, receiver)
    port = receiver.add_insecure_port("127.0.0.1:0")
    receiver.start()
    return collector, receiver, port


def test_a_span_per_rpc_with_model_status_and_parent(small_repo: Path) -> None:
    collector, receiver, port = start_collector()
    srv = serve(
        small_repo,
        tracing__enabled=True,
        tracing__service_name="tensord-test",
        tracing__otlp_endpoint=f"http://127.0.0.1:{port}",
    )
    try:
        with Client(srv.target, timeout=10, retries=0) as client:
            x = np.zeros((1, 512), np.float32)
            traced = client._stub.Predict(
                predict_request("mlp", {"input": x}, 0, None, False),
                metadata=(
                    ("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01"),
                    ("x-request-id", "traced-1"),
                ),
                timeout=10,
            )
            assert traced.model == "mlp"
            with pytest.raises(grpc.RpcError):
                client.predict("nope", {"input": x})
            with pytest.raises(grpc.RpcError):
                list(client.generate("mlp", "hi"))
    finally:
        srv.stop()  # flushes the batch of spans
        receiver.stop(0)
    spans = collector.spans()
    assert {r["service.name"] for r, _ in spans} == {"tensord-test"}
    by_request = {attributes(s)["tensord.request_id"]: s for _, s in spans}
    assert len(spans) == 3
    predict = by_request["traced-1"]
    assert predict.name == "tensord.v1.InferenceService/Predict"
    assert predict.kind == predict.SPAN_KIND_SERVER
    assert predict.trace_id.hex() == TRACE_ID and predict.parent_span_id.hex() == PARENT_ID
    assert attributes(predict) == {
        "rpc.system": "grpc",
        "rpc.service": "tensord.v1.InferenceService",
        "rpc.method": "Predict",
        "rpc.grpc.status_code": 0,
        "tensord.model": "mlp",
        "tensord.request_id": "traced-1",
    }
    assert predict.end_time_unix_nano > predict.start_time_unix_nano
    others = [s for _, s in spans if s is not predict]
    not_found = next(s for s in others if attributes(s)["rpc.method"] == "Predict")
    assert attributes(not_found)["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert attributes(not_found)["tensord.model"] == "_unknown"
    assert not_found.status.code == not_found.status.STATUS_CODE_UNSET  # the caller's doing
    generate = next(s for s in others if attributes(s)["rpc.method"] == "Generate")
    code = attributes(generate)["rpc.grpc.status_code"]
    assert code == grpc.StatusCode.FAILED_PRECONDITION.value[0]  # mlp is no generator
    assert generate.status.code == generate.status.STATUS_CODE_UNSET  # the caller's doing
    assert len(generate.parent_span_id) == 0  # no traceparent: a root span


class FailingBackend(WrappedBackend):
    """A real ONNX Runtime backend that fails with INTERNAL on an input starting with -1
    (the warm-up, on zeros, passes)."""

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        if any(array.size and array.flat[0] == -1 for array in inputs.values()):
            raise InternalError("the backend failed")
        return super().run(inputs, output_names)


def test_a_failure_the_server_owns_marks_the_span_as_an_error(small_repo: Path) -> None:
    def factory(path: Path, config: ModelConfig, where: DeviceOptions) -> Backend:
        return FailingBackend(default_backend_factory(path, config, where))

    collector, receiver, port = start_collector()
    overrides = {
        "model_repository": str(small_repo),
        "server.listen": "127.0.0.1:0",
        "tracing.enabled": True,
        "tracing.otlp_endpoint": f"http://127.0.0.1:{port}",
    }
    config = load_config(None, env={}, overrides=overrides)
    srv = ServerThread(config, backend_factory=factory).start()
    try:
        with (
            Client(srv.target, timeout=10, retries=0) as client,
            pytest.raises(grpc.RpcError) as caught,
        ):
            x = np.full((1, 512), -1, np.float32)
            client.predict("mlp", {"input": x}, request_id="failing-1")
    finally:
        srv.stop()  # flushes the batch of spans
        receiver.stop(0)
    err = caught.value
    assert err.code() == grpc.StatusCode.INTERNAL
    (span,) = [s for _, s in collector.spans()]
    assert attributes(span) == {
        "rpc.system": "grpc",
        "rpc.service": "tensord.v1.InferenceService",
        "rpc.method": "Predict",
        "rpc.grpc.status_code": grpc.StatusCode.INTERNAL.value[0],
        "tensord.model": "mlp",
        "tensord.request_id": "failing-1",
    }
    assert span.status.code == span.status.STATUS_CODE_ERROR
    assert span.status.message == f"INTERNAL: {err.details()}"


def test_enabled_without_opentelemetry_logs_why(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith("opentelemetry")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails as if absent
    with structlog.testing.capture_logs() as logs:
        assert build_tracer(TracingSettings(enabled=True)) is None
        assert build_tracer(TracingSettings(enabled=False)) is None
    assert logs == [
        {
            "event": "tracing.unavailable",
            "log_level": "warning",
            "reason": "OpenTelemetry is not installed (opentelemetry); install the otel "
            'extra from the clone: pip install -e ".[otel]"',
        }
    ]


def test_http_requests_get_http_spans(demo_repo: Path) -> None:
    pytest.importorskip("starlette")
    import json
    import urllib.error
    import urllib.request

    collector, receiver, port = start_collector()
    srv = serve(
        demo_repo,
        openai__listen="127.0.0.1:0",
        tracing__enabled=True,
        tracing__otlp_endpoint=f"http://127.0.0.1:{port}",
    )
    try:
        assert srv.server is not None and srv.server.openai is not None
        url = f"http://127.0.0.1:{srv.server.openai.port}/v1/completions"
        body = {"model": "tinylm", "prompt": "hi", "max_tokens": 2}
        headers = {
            "content-type": "application/json",
            "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
            "x-request-id": "http-1",
        }
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        missing = urllib.request.Request(
            url, json.dumps({**body, "model": "nope"}).encode(), {"x-request-id": "http-2"}
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(missing, timeout=30)
        assert caught.value.code == 404
    finally:
        srv.stop()  # flushes the batch of spans
        receiver.stop(0)
    by_request = {attributes(s)["tensord.request_id"]: s for _, s in collector.spans()}
    served = by_request["http-1"]
    assert served.name == "POST /v1/completions" and served.kind == served.SPAN_KIND_SERVER
    assert served.trace_id.hex() == TRACE_ID and served.parent_span_id.hex() == PARENT_ID
    assert attributes(served) == {
        "http.request.method": "POST",
        "http.route": "/v1/completions",
        "http.response.status_code": 200,
        "url.scheme": "http",
        "tensord.status": "OK",
        "tensord.model": "tinylm",
        "tensord.request_id": "http-1",
    }
    not_found = by_request["http-2"]
    assert attributes(not_found)["http.response.status_code"] == 404
    assert attributes(not_found)["tensord.status"] == "NOT_FOUND"
    assert not_found.status.code == not_found.status.STATUS_CODE_UNSET  # the caller's doing
