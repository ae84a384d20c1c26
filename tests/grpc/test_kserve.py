"""The Open Inference Protocol (KServe v2) service through a real server, driven by
Triton's own Python client (tritonclient): outputs equal in-process ONNX Runtime bit for
bit, metadata and configuration as Triton's clients read them, errors mapped, auth
enforced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tests.conftest import ServerThread, serve
from tests.grpc.test_auth import ADMIN, MLP_ONLY, write_tokens
from tests.grpc.test_predict import identity_input, reference
from tests.models import IDENTITY_DTYPES
from tests.tools import require_module


def tritonclient() -> Any:
    """tritonclient.grpc (`make test` installs it; missing, the tests skip, or fail in CI)."""
    return require_module("tritonclient.grpc", "make test (it installs tritonclient)")


KSERVE_NAMES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
    "string": "BYTES",
}


@pytest.fixture(scope="module")
def kserve(server: ServerThread) -> Iterator[Any]:
    with tritonclient().InferenceServerClient(server.target) as client:
        yield client


def infer(client: Any, model: str, feeds: dict[str, np.ndarray], **options: Any) -> Any:
    inputs = []
    for name, array in feeds.items():
        kind = KSERVE_NAMES[array.dtype.name if array.dtype != object else "string"]
        tensor = tritonclient().InferInput(name, list(array.shape), kind)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs, **options)


def status_of(call: Any) -> tuple[str, str]:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as raised:
        call()
    return str(raised.value.status()), str(raised.value.message())


@pytest.mark.parametrize("batch", [1, 3, 32])
def test_mlp_matches_onnxruntime(kserve: Any, test_repo: Path, batch: int) -> None:
    x = np.random.default_rng(batch).normal(size=(batch, 512)).astype(np.float32)
    result = infer(kserve, "mlp", {"input": x})
    (expected,) = reference(test_repo / "mlp" / "1" / "model.onnx", {"input": x})
    out = result.as_numpy("output")
    assert out.dtype == np.float32 and out.shape == (batch, 10)
    assert out.tobytes() == expected.tobytes()
    response = result.get_response()
    assert response.model_name == "mlp" and response.model_version == "1"


def test_cnn_batched_matches_onnxruntime(kserve: Any, test_repo: Path) -> None:
    images = np.random.default_rng(5).integers(0, 256, (5, 3, 32, 32), dtype=np.uint8)
    out = infer(kserve, "cnn_batched", {"image": images}).as_numpy("probabilities")
    (expected,) = reference(test_repo / "cnn" / "1" / "model.onnx", {"image": images})
    assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize("name", list(IDENTITY_DTYPES))
def test_every_dtype_round_trips(kserve: Any, name: str) -> None:
    x = identity_input(name)
    y = infer(kserve, f"identity_{name}", {"x": x}).as_numpy("y")
    assert y.shape == x.shape
    if name == "string":
        assert [[v.decode() for v in row] for row in y.tolist()] == x.tolist()
    else:
        assert y.dtype == x.dtype and y.tobytes() == x.tobytes()


def test_typed_contents_requested_outputs_and_id(server: ServerThread) -> None:
    """A request typed by hand (contents, no raw bytes), asking for one output by name."""
    from tensord.kserve.v2 import grpc_service_pb2 as pb
    from tensord.kserve.v2 import grpc_service_pb2_grpc as pb_grpc

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    request = pb.ModelInferRequest(model_name="two_outputs", model_version="1", id="req-7")
    for name in ("a", "b"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[2, 3])
        tensor.contents.fp32_contents.extend(a.ravel().tolist())
    request.outputs.add(name="product")
    with grpc.insecure_channel(server.target) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert response.id == "req-7" and [o.name for o in response.outputs] == ["product"]
    (output,) = response.outputs
    assert output.datatype == "FP32" and list(output.shape) == [2, 3]
    product = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 3)
    assert product.tobytes() == (a * a).tobytes()


def test_server_and_model_state(kserve: Any) -> None:
    assert kserve.is_server_live() and kserve.is_server_ready()
    assert kserve.is_model_ready("mlp") and kserve.is_model_ready("versioned", "1")
    assert not kserve.is_model_ready("versioned", "9")
    assert not kserve.is_model_ready("no_such_model")
    assert not kserve.is_model_ready("broken")
    metadata = kserve.get_server_metadata()
    assert metadata.name == "tensord" and "model_configuration" in metadata.extensions


def test_model_metadata(kserve: Any) -> None:
    m = kserve.get_model_metadata("mlp")
    assert (m.name, list(m.versions), m.platform) == ("mlp", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in m.inputs] == [("input", "FP32", [-1, 512])]
    assert [(t.name, t.datatype, list(t.shape)) for t in m.outputs] == [
        ("output", "FP32", [-1, 10])
    ]
    assert list(kserve.get_model_metadata("versioned").versions) == ["1", "2"]


def test_model_config_as_perf_analyzer_reads_it(kserve: Any) -> None:
    plain = kserve.get_model_config("identity_int64").config
    assert plain.max_batch_size == 64 and plain.platform == "onnxruntime_onnx"
    assert plain.backend == "onnxruntime" and not plain.HasField("dynamic_batching")
    (x,) = plain.input
    assert (x.name, list(x.dims)) == ("x", [4])
    assert tritonclient().model_config_pb2.DataType.Name(x.data_type) == "TYPE_INT64"
    batched = kserve.get_model_config("mlp_batched").config
    assert batched.max_batch_size == 32
    assert list(batched.dynamic_batching.preferred_batch_size) == [16, 32]
    assert batched.dynamic_batching.max_queue_delay_microseconds == 2000
    assert list(batched.input[0].dims) == [512]


def test_model_statistics(kserve: Any) -> None:
    x = np.zeros((2, 512), np.float32)
    for _ in range(3):
        infer(kserve, "mlp_batched", {"input": x})
    (stats,) = kserve.get_inference_statistics("mlp_batched").model_stats
    assert stats.name == "mlp_batched" and stats.version == "1"
    assert stats.inference_count >= 6 and stats.inference_stats.success.count >= 3
    assert stats.execution_count >= 1
    assert stats.inference_stats.compute_infer.ns > 0
    every = kserve.get_inference_statistics("").model_stats
    assert {"mlp", "cnn", "mlp_batched"} <= {s.name for s in every}


def test_statistics_count_each_request(kserve: Any) -> None:
    """Per request, as perf_analyzer's server-side report reads them: successes with their
    time, and the queue and compute time inside it, whichever protocol brought them."""
    x = np.zeros((1, 512), np.float32)
    (before,) = kserve.get_inference_statistics("mlp").model_stats
    for _ in range(4):
        infer(kserve, "mlp", {"input": x})
    (after,) = kserve.get_inference_statistics("mlp").model_stats
    b, a = before.inference_stats, after.inference_stats
    assert a.success.count - b.success.count == 4
    assert after.inference_count - before.inference_count == 4
    assert a.queue.count - b.queue.count == 4 and a.compute_infer.count - b.compute_infer.count == 4
    spent = a.success.ns - b.success.ns
    assert 0 < (a.queue.ns - b.queue.ns) + (a.compute_infer.ns - b.compute_infer.ns) <= spent
    assert a.fail.count == b.fail.count
    assert after.last_inference >= before.last_inference and after.last_inference > 0


def test_errors_are_mapped(kserve: Any) -> None:
    x = np.zeros((1, 512), np.float32)
    code, message = status_of(lambda: infer(kserve, "no_such_model", {"input": x}))
    assert code == "StatusCode.NOT_FOUND" and "no_such_model" in message
    code, message = status_of(lambda: infer(kserve, "mlp", {"wrong": x}))
    assert code == "StatusCode.INVALID_ARGUMENT" and "wrong" in message
    code, message = status_of(lambda: infer(kserve, "mlp", {"input": x.astype(np.float64)}))
    assert code == "StatusCode.INVALID_ARGUMENT" and "input" in message
    code, message = status_of(lambda: infer(kserve, "mlp", {"input": np.zeros((1, 7), np.float32)}))
    assert code == "StatusCode.INVALID_ARGUMENT" and "7" in message
    code, _ = status_of(lambda: kserve.get_model_metadata("no_such_model"))
    assert code == "StatusCode.NOT_FOUND"
    code, message = status_of(lambda: kserve.get_model_config("mlp", "x1"))
    assert code == "StatusCode.INVALID_ARGUMENT" and "version" in message
    code, message = status_of(lambda: infer(kserve, "mlp", {"input": x}, sequence_id=4))
    assert code == "StatusCode.INVALID_ARGUMENT" and "sequence" in message
    code, message = status_of(lambda: infer(kserve, "broken", {"input": x}))
    assert code == "StatusCode.FAILED_PRECONDITION"
    code, _ = status_of(lambda: kserve.get_system_shared_memory_status())
    assert code == "StatusCode.UNIMPLEMENTED"


def test_generator_answers_model_infer_with_a_clear_error(kserve: Any) -> None:
    ids = np.array([[1, 2, 3]], np.int64)
    code, message = status_of(lambda: infer(kserve, "tinylm", {"input_ids": ids}))
    assert code == "StatusCode.FAILED_PRECONDITION"
    assert "generator" in message and "Generate" in message


@pytest.fixture(scope="module")
def auth_server(
    small_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    tokens = write_tokens(tmp_path_factory.mktemp("kserve-auth") / "tokens.toml")
    srv = serve(small_repo, auth__token_file=tokens)
    yield srv
    srv.stop()


def test_bearer_token_is_enforced(auth_server: ServerThread) -> None:
    x = np.zeros((1, 512), np.float32)
    images = np.zeros((1, 3, 32, 32), np.uint8)
    with tritonclient().InferenceServerClient(auth_server.target) as client:
        code, _ = status_of(lambda: infer(client, "mlp", {"input": x}))
        assert code == "StatusCode.UNAUTHENTICATED"
        admin = {"authorization": f"Bearer {ADMIN}"}
        assert infer(client, "mlp", {"input": x}, headers=admin).as_numpy("output").shape == (1, 10)
        mlp_only = {"authorization": f"Bearer {MLP_ONLY}"}
        assert infer(client, "mlp", {"input": x}, headers=mlp_only).as_numpy("output") is not None
        code, _ = status_of(lambda: infer(client, "cnn", {"image": images}, headers=mlp_only))
        assert code == "StatusCode.PERMISSION_DENIED"
        code, _ = status_of(lambda: client.get_model_metadata("cnn", headers=mlp_only))
        assert code == "StatusCode.PERMISSION_DENIED"
        names = {s.name for s in client.get_inference_statistics("", headers=mlp_only).model_stats}
        assert names == {"mlp"}


def hand_made(server: ServerThread, request: Any) -> tuple[grpc.StatusCode, str]:
    """The status of a ModelInfer built by hand (what tritonclient never sends)."""
    from tensord.kserve.v2 import grpc_service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request)
    return raised.value.code(), raised.value.details()


def test_malformed_tensors_are_refused_with_the_field_named(server: ServerThread) -> None:
    from tensord.kserve.v2 import grpc_service_pb2 as pb

    def request(datatype: str, values: dict[str, list[Any]] | None = None) -> Any:
        r = pb.ModelInferRequest(model_name="identity_int8")
        tensor = r.inputs.add(name="x", datatype=datatype, shape=[1, 4])
        for field, items in (values or {}).items():
            getattr(tensor.contents, field).extend(items)
        return r

    cases = [
        (request("UINT32", {"uint_contents": [1, 2, 3, 4]}), "UINT32"),
        (request("INT8", {"int_contents": [1, 2, 3, 400]}), "out of range"),
        (request("INT8", {"int_contents": [1, 2]}), "needs 4"),
        (request("INT8", {"fp32_contents": [1, 2, 3, 4]}), "int_contents"),
        (request("FP16"), "raw_input_contents"),
    ]
    short_raw = request("INT8")
    short_raw.raw_input_contents.append(b"\x01\x02")
    cases.append((short_raw, "needs 4"))
    two_raw = request("INT8")
    two_raw.raw_input_contents.extend([b"\x00" * 4, b"\x00" * 4])
    cases.append((two_raw, "one per input"))
    for bad, expected in cases:
        code, message = hand_made(server, bad)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, message
        assert expected in message, message


def test_model_infer_is_traced_under_its_own_service(small_repo: Path) -> None:
    from tests.grpc.test_tracing import attributes, start_collector

    require_module("opentelemetry.sdk", "make test")
    collector, receiver, port = start_collector()
    srv = serve(
        small_repo,
        tracing__enabled=True,
        tracing__otlp_endpoint=f"http://127.0.0.1:{port}",
    )
    try:
        with tritonclient().InferenceServerClient(srv.target) as client:
            infer(client, "mlp", {"input": np.zeros((1, 512), np.float32)})
    finally:
        srv.stop()  # flushes the batch of spans
        receiver.stop(0)
    (span,) = [s for _, s in collector.spans()]
    assert span.name == "inference.GRPCInferenceService/ModelInfer"
    found = attributes(span)
    assert found["rpc.service"] == "inference.GRPCInferenceService"
    assert found["tensord.model"] == "mlp" and found["rpc.grpc.status_code"] == 0
