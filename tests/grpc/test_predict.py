"""Predict through a real server equals in-process ONNX Runtime, bit for bit."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from tensord.backends.onnxruntime import session_options
from tensord.modelconfig.model import ModelConfig
from tensord.v1 import inference_pb2 as pb
from tensord_client import Client
from tests.conftest import ServerThread
from tests.models import IDENTITY_DTYPES


def reference(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The same model in-process, with the daemon's session options."""
    session = ort.InferenceSession(
        str(path), session_options(ModelConfig()), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "contents"])
@pytest.mark.parametrize("batch", [0, 1, 3, 32, 128])
def test_mlp_matches_onnxruntime(client: Client, test_repo: Path, batch: int, typed: bool) -> None:
    x = np.random.default_rng(batch).normal(size=(batch, 512)).astype(np.float32)
    reply = client.predict_response("mlp", {"input": x}, typed=typed)
    from tensord_client._common import predict_outputs

    out = predict_outputs(reply)["output"]
    (expected,) = reference(test_repo / "mlp" / "1" / "model.onnx", {"input": x})
    assert out.dtype == np.float32 and out.shape == (batch, 10)
    assert out.tobytes() == expected.tobytes()
    assert reply.model == "mlp" and reply.version == 1
    assert reply.timing.total_us >= reply.timing.compute_us >= 0


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_cnn_matches_onnxruntime(client: Client, test_repo: Path, batch: int) -> None:
    images = np.random.default_rng(batch).integers(0, 256, (batch, 3, 32, 32), dtype=np.uint8)
    out = client.predict("cnn", {"image": images})["probabilities"]
    (expected,) = reference(test_repo / "cnn" / "1" / "model.onnx", {"image": images})
    assert out.tobytes() == expected.tobytes()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def identity_input(name: str) -> np.ndarray:
    rng = np.random.default_rng(len(name))
    if name == "string":
        return np.array([[f"w{i}{j}ü" for j in range(4)] for i in range(3)], dtype=object)
    if name == "bool":
        return rng.integers(0, 2, (3, 4)).astype(bool)
    if name == "bfloat16":
        return rng.normal(size=(3, 4)).astype(ml_dtypes.bfloat16)
    dtype = np.dtype(name)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    return rng.normal(0, 1e3, (3, 4)).astype(dtype)


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "contents"])
@pytest.mark.parametrize("name", list(IDENTITY_DTYPES))
def test_every_dtype_round_trips(client: Client, name: str, typed: bool) -> None:
    x = identity_input(name)
    from tensord_client._common import predict_outputs

    y = predict_outputs(client.predict_response(f"identity_{name}", {"x": x}, typed=typed))["y"]
    assert y.shape == x.shape
    if name == "string":
        assert y.tolist() == x.tolist()
    else:
        assert y.dtype == x.dtype
        assert y.tobytes() == x.tobytes()


def test_output_subset_in_asked_order(client: Client) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 2, dtype=np.float32)
    both = client.predict("two_outputs", {"a": a, "b": b}, outputs=["product", "sum"])
    assert list(both) == ["product", "sum"]
    assert both["product"].tolist() == (a * b).tolist()
    only = client.predict("two_outputs", {"a": a, "b": b}, outputs=["sum"])
    assert list(only) == ["sum"] and only["sum"].tolist() == (a + b).tolist()


def test_versions_latest_by_default(client: Client) -> None:
    x = np.ones((1, 4), np.float32)
    latest = client.predict_response("versioned", {"x": x})
    assert latest.version == 2
    from tensord_client._common import predict_outputs

    assert predict_outputs(latest)["y"].tolist() == [[2, 2, 2, 2]]
    assert client.predict("versioned", {"x": x}, version=1)["y"].tolist() == [[1, 1, 1, 1]]


def test_request_id_is_echoed(server: ServerThread) -> None:
    import grpc

    from tensord.v1 import inference_pb2 as pb
    from tensord.v1 import inference_pb2_grpc as pb_grpc

    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        _, call = stub.Health.with_call(pb.HealthRequest(), metadata=[("x-request-id", "req-42")])
        assert ("x-request-id", "req-42") in [(m.key, m.value) for m in call.trailing_metadata()]
        _, call = stub.Health.with_call(pb.HealthRequest())
        made = dict((m.key, m.value) for m in call.trailing_metadata())["x-request-id"]
        assert len(made) == 32 and int(made, 16) >= 0


async def test_async_client(server: ServerThread, test_repo: Path) -> None:
    from tensord_client import AsyncClient

    x = np.random.default_rng(9).normal(size=(4, 512)).astype(np.float32)
    async with AsyncClient(server.target, retries=0) as aclient:
        out = await aclient.predict("mlp", {"input": x})
        health = await aclient.health()
    (expected,) = reference(test_repo / "mlp" / "1" / "model.onnx", {"input": x})
    assert out["output"].tobytes() == expected.tobytes()
    assert health.status == 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int64"])
def test_scalar_tensors_keep_their_rank(tmp_path: Path, dtype: str) -> None:
    import onnx
    from onnx import helper

    from tests.conftest import start_server

    elem = IDENTITY_DTYPES[dtype]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "scalar",
        [helper.make_tensor_value_info("x", elem, [])],
        [helper.make_tensor_value_info("y", elem, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "scalar" / "1").mkdir(parents=True)
    onnx.save(model, tmp_path / "scalar" / "1" / "model.onnx")
    numpy_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.array(3, dtype=numpy_dtype)
    srv = start_server(tmp_path)
    try:
        with Client(srv.target, retries=0) as client:
            y = client.predict("scalar", {"x": x})["y"]
    finally:
        srv.stop()
    assert y.shape == () and y.dtype == x.dtype and y.tobytes() == x.tobytes()


def test_a_shapeless_input_is_served_with_the_shape_model_toml_gives(tmp_path: Path) -> None:
    import grpc
    import onnx
    from onnx import TensorProto, helper

    from tests.conftest import start_server

    # x and y carry no shape at all (not even a rank); ONNX Runtime reports them as rank 0.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "shapeless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for name in ("declared", "undeclared"):
        (tmp_path / name / "1").mkdir(parents=True)
        onnx.save(model, tmp_path / name / "1" / "model.onnx")
    (tmp_path / "declared" / "model.toml").write_text('[[inputs]]\nname = "x"\nshape = [-1, 3]\n')
    srv = start_server(tmp_path)
    try:
        with Client(srv.target, retries=0) as client:
            x = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.0]], np.float32)
            y = client.predict("declared", {"x": x})["y"]
            with pytest.raises(grpc.RpcError) as wrong_rank:
                client.predict("declared", {"x": np.zeros(3, np.float32)})
            models = {m.name: m for m in client.info().models}
    finally:
        srv.stop()
    assert y.tolist() == [[0.0, 0.5, 2.0], [3.0, 0.0, 0.0]]
    assert wrong_rank.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (x_spec,), (y_spec,) = models["declared"].inputs, models["declared"].outputs
    assert (list(x_spec.shape), x_spec.unknown_rank) == ([-1, 3], False)
    assert (list(y_spec.shape), y_spec.unknown_rank) == ([], True)
    # Without a shape for x the version fails to load, saying what to write.
    undeclared = models["undeclared"]
    assert undeclared.state == pb.MODEL_STATE_FAILED
    assert "input 'x' has no shape in the model" in undeclared.reason
    assert '[[inputs]] name = "x" shape = [' in undeclared.reason
