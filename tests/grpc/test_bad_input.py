"""Bad input: the status from the error table, a message a person can act on, and the
next good request is served normally."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from tensord.server.tensord_v1.codec import decode_tensor, encode_tensor
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc
from tensord_client import Client
from tests.conftest import ServerThread, start_server

Code = grpc.StatusCode
X = np.ones((1, 512), np.float32)


def good_input() -> pb.Tensor:
    return encode_tensor("input", X)


def mlp(*inputs: pb.Tensor, **kw: object) -> pb.PredictRequest:
    return pb.PredictRequest(model="mlp", inputs=list(inputs), **kw)  # type: ignore[arg-type]


def tensor(**kw: object) -> pb.Tensor:
    return pb.Tensor(name="input", dtype=pb.DATA_TYPE_FLOAT32, **kw)  # type: ignore[arg-type]


CASES: list[tuple[str, pb.PredictRequest, Code, str]] = [
    (
        "unknown model",
        pb.PredictRequest(model="nope", inputs=[good_input()]),
        Code.NOT_FOUND,
        "model 'nope' not found; models: broken, classifier, classifier_batched, cnn,",
    ),
    (
        "unknown version",
        mlp(good_input(), version=7),
        Code.NOT_FOUND,
        "model 'mlp' has no version 7; versions: 1 (0 means the newest ready)",
    ),
    (
        "unknown input",
        mlp(good_input(), encode_tensor("extra", X)),
        Code.INVALID_ARGUMENT,
        "model 'mlp' has no input 'extra'; it takes 'input' (DATA_TYPE_FLOAT32 [-1, 512])",
    ),
    (
        "missing input",
        mlp(),
        Code.INVALID_ARGUMENT,
        "model 'mlp' is missing input(s) 'input' (DATA_TYPE_FLOAT32 [-1, 512])",
    ),
    (
        "wrong dtype",
        mlp(encode_tensor("input", X.astype(np.float64))),
        Code.INVALID_ARGUMENT,
        "input 'input': dtype DATA_TYPE_FLOAT64 does not match the model's DATA_TYPE_FLOAT32",
    ),
    (
        "wrong rank",
        mlp(encode_tensor("input", X.reshape(1, 1, 512))),
        Code.INVALID_ARGUMENT,
        "input 'input': shape [1, 1, 512] has rank 3, but the model expects rank 2 [-1, 512]",
    ),
    (
        "wrong dimension",
        mlp(encode_tensor("input", X[:, :100])),
        Code.INVALID_ARGUMENT,
        "input 'input': dimension 1 is 100, but the model expects 512",
    ),
    (
        "byte length",
        mlp(tensor(shape=[1, 512], raw_data=b"\0" * 2047)),
        Code.INVALID_ARGUMENT,
        "inputs[0] 'input': raw_data has 2047 bytes, but shape [1, 512] of DATA_TYPE_FLOAT32 "
        "needs 2048",
    ),
    (
        "no data",
        mlp(tensor(shape=[2, 512])),
        Code.INVALID_ARGUMENT,
        "inputs[0] 'input': no data for shape [2, 512] (1024 elements); set 4096 bytes of raw_data",
    ),
    (
        "dtype unset",
        mlp(pb.Tensor(name="input", shape=[1, 512], raw_data=X.tobytes())),
        Code.INVALID_ARGUMENT,
        "inputs[0] 'input': dtype is not set; expected one of",
    ),
    (
        "negative dim",
        mlp(tensor(shape=[-1, 512], raw_data=b"")),
        Code.INVALID_ARGUMENT,
        "has a negative dimension",
    ),
    (
        "typed wrong field",
        mlp(tensor(shape=[1, 2], contents=pb.TensorContents(int_values=[1, 2]))),
        Code.INVALID_ARGUMENT,
        "contents.int_values is set, but a DATA_TYPE_FLOAT32 tensor takes its "
        "values in contents.float_values",
    ),
    (
        "typed wrong count",
        mlp(tensor(shape=[1, 512], contents=pb.TensorContents(float_values=[1.0]))),
        Code.INVALID_ARGUMENT,
        "contents.float_values has 1 values, but shape [1, 512] needs 512",
    ),
    (
        "string to float",
        mlp(encode_tensor("input", np.array([["a"] * 512], dtype=object))),
        Code.INVALID_ARGUMENT,
        "dtype DATA_TYPE_STRING does not match the model's DATA_TYPE_FLOAT32",
    ),
    (
        "over max batch",
        mlp(encode_tensor("input", np.zeros((129, 512), np.float32))),
        Code.INVALID_ARGUMENT,
        "batch size 129 exceeds the model's max_batch_size 128",
    ),
    (
        "unknown output",
        mlp(good_input(), output_names=["logits"]),
        Code.INVALID_ARGUMENT,
        "model 'mlp' has no output 'logits'; its outputs are ['output']",
    ),
    (
        "rank over 64",
        mlp(tensor(shape=[1] * 65, raw_data=b"")),
        Code.INVALID_ARGUMENT,
        "inputs[0] 'input': shape has rank 65; at most 64 dimensions are supported",
    ),
    (
        "shape too large to hold",
        mlp(tensor(shape=[0, 2**62])),
        Code.INVALID_ARGUMENT,
        "inputs[0] 'input': shape [0, 4611686018427387904] is too large to hold in memory "
        "(more than 2^62 bytes, 4 EiB",
    ),
    (
        "more strings than bytes",  # refused before anything is allocated for 2**28 strings
        pb.PredictRequest(
            model="identity_string",
            inputs=[pb.Tensor(name="x", dtype=pb.DATA_TYPE_STRING, shape=[2**26, 4], raw_data=b"")],
        ),
        Code.INVALID_ARGUMENT,
        "inputs[0] 'x': raw_data has 0 bytes, too few for 268435456 strings",
    ),
    (
        "bool byte not 0 or 1",
        pb.PredictRequest(
            model="identity_bool",
            inputs=[
                pb.Tensor(name="x", dtype=pb.DATA_TYPE_BOOL, shape=[1, 4], raw_data=b"\1\2\0\0")
            ],
        ),
        Code.INVALID_ARGUMENT,
        "inputs[0] 'x': raw_data byte 1 is 2; BOOL raw_data is one byte per element, 0 or 1",
    ),
    (
        "very long model name",
        pb.PredictRequest(model="m" * 20_000, inputs=[good_input()]),
        Code.INVALID_ARGUMENT,
        "the model name takes 20000 bytes; names are at most 4096 bytes",
    ),
    (
        "failed model",  # final until a reload: FAILED_PRECONDITION, which clients do not retry
        pb.PredictRequest(model="broken", inputs=[good_input()]),
        Code.FAILED_PRECONDITION,
        "model 'broken' version 1 is FAILED: ONNX Runtime cannot load",
    ),
]


@pytest.fixture(scope="module")
def stub(server: ServerThread):  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.InferenceServiceStub(channel)


def assert_still_serving(stub: pb_grpc.InferenceServiceStub) -> None:
    reply = stub.Predict(mlp(good_input()), timeout=30)
    assert list(reply.outputs[0].shape) == [1, 10]


@pytest.mark.parametrize(
    ("request_", "code", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_request(
    stub: pb_grpc.InferenceServiceStub, request_: pb.PredictRequest, code: Code, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request_, timeout=30)
    assert info.value.code() == code
    assert message in info.value.details()
    assert_still_serving(stub)


def test_zero_size_batch_is_served(stub: pb_grpc.InferenceServiceStub) -> None:
    reply = stub.Predict(mlp(tensor(shape=[0, 512])), timeout=30)
    assert list(reply.outputs[0].shape) == [0, 10] and reply.outputs[0].raw_data == b""


def test_message_over_the_limit(stub: pb_grpc.InferenceServiceStub) -> None:
    big = np.zeros((5, 1024 * 1024 // 4 * 1), np.float32)  # 5 MiB, the test server takes 4 MiB
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(
            pb.PredictRequest(model="mlp", inputs=[encode_tensor("input", big)]), timeout=30
        )
    assert info.value.code() == Code.RESOURCE_EXHAUSTED
    assert "larger than max" in info.value.details()
    assert_still_serving(stub)


def test_bytes_that_are_not_the_request_message(server: ServerThread) -> None:
    with grpc.insecure_channel(server.target) as channel:
        predict = channel.unary_unary("/tensord.v1.InferenceService/Predict")
        for garbage in (b"\xff\xff\xff", b"\x0a\x05ab"):  # bad tag; truncated string
            with pytest.raises(grpc.RpcError) as info:
                predict(garbage, timeout=30)
            assert info.value.code() == Code.INVALID_ARGUMENT
            assert "the request is not a valid tensord.v1.PredictRequest message" in (
                info.value.details()
            )
        stub = pb_grpc.InferenceServiceStub(channel)
        assert_still_serving(stub)


def test_outputs_larger_than_a_reply_are_refused_before_encoding(test_repo: Path) -> None:
    srv = start_server(test_repo, max_send_message_bytes=1024)
    x = np.arange(64 * 4, dtype=np.float64).reshape(64, 4)  # 2,048 bytes either way
    try:
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            request = pb.PredictRequest(model="identity_float64", inputs=[encode_tensor("x", x)])
            for encoding, words in (
                (pb.TENSOR_ENCODING_RAW, "at least 2048 bytes as raw bytes"),
                (pb.TENSOR_ENCODING_CONTENTS, "at least 2048 bytes as typed contents"),
            ):
                request.output_encoding = encoding
                with pytest.raises(grpc.RpcError) as info:
                    stub.Predict(request, timeout=30)
                assert info.value.code() == Code.RESOURCE_EXHAUSTED
                assert words in info.value.details()
                assert "server.max_send_message_bytes" in info.value.details()
            small = pb.PredictRequest(model="identity_float64", inputs=[encode_tensor("x", x[:8])])
            reply = stub.Predict(small, timeout=30)
            assert list(reply.outputs[0].shape) == [8, 4]
    finally:
        srv.stop()


def test_large_typed_tensors_convert_off_the_event_loop(
    stub: pb_grpc.InferenceServiceStub,
) -> None:
    # Over 32,768 typed values each way: decoded and encoded on a worker thread, exactly.
    x = np.random.default_rng(5).normal(size=(100, 512)).astype(np.float32)
    raw = stub.Predict(mlp(encode_tensor("input", x)), timeout=60)
    typed = stub.Predict(mlp(encode_tensor("input", x, contents=True)), timeout=60)
    assert typed.outputs[0].raw_data == raw.outputs[0].raw_data
    h = np.random.default_rng(6).normal(size=(40, 1024)).astype(np.float32)
    request = pb.PredictRequest(model="slow", inputs=[encode_tensor("x", h)])
    as_raw = decode_tensor(stub.Predict(request, timeout=60).outputs[0], "outputs")[1]
    request.output_encoding = pb.TENSOR_ENCODING_CONTENTS
    reply = stub.Predict(request, timeout=60)
    assert reply.outputs[0].WhichOneof("data") == "contents"
    as_typed = decode_tensor(reply.outputs[0], "outputs")[1]
    assert as_typed.size == 40 * 1024 and np.array_equal(as_typed, as_raw)


def test_generate_on_a_predict_model(stub: pb_grpc.InferenceServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(pb.GenerateRequest(model="mlp", prompt="hi"), timeout=30))
    assert info.value.code() == Code.FAILED_PRECONDITION
    assert "'mlp' is a predict model" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(pb.GenerateRequest(model="nope", prompt="hi"), timeout=30))
    assert info.value.code() == Code.NOT_FOUND
    assert_still_serving(stub)


def slow_request(batch: int) -> pb.PredictRequest:
    x = np.random.default_rng(0).normal(size=(batch, 1024)).astype(np.float32)
    return pb.PredictRequest(model="slow", inputs=[encode_tensor("x", x)])


def calibrate(stub: pb_grpc.InferenceServiceStub) -> tuple[int, float]:
    """A batch whose run takes at least ~0.3 s here, and its compute time in seconds."""
    batch = 64
    while True:
        seconds = stub.Predict(slow_request(batch), timeout=60).timing.compute_us / 1e6
        if seconds >= 0.3 or batch >= 512:  # 512 rows are 2 MiB, under the test limit
            return batch, seconds
        batch *= 2


def in_background(fn: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    return thread


@dataclass
class SlowStats:
    """The slow model's executor, as Info shows it."""

    started: int
    running: int
    queue_depth: int


def slow_stats(server: ServerThread) -> SlowStats:
    with Client(server.target, timeout=10, retries=0) as client:
        (model,) = [m for m in client.info().models if m.name == "slow"]
    status = model.executor_status
    return SlowStats(sum(lane.runs for lane in status.lanes), status.running, status.queue_depth)


def hold_the_instance(
    stub: pb_grpc.InferenceServiceStub, server: ServerThread, batch: int
) -> tuple[threading.Thread, int]:
    """Start a long run on the slow model's only lane; return its thread and runs so far."""
    started = slow_stats(server).started
    thread = in_background(lambda: stub.Predict(slow_request(batch), timeout=60))
    deadline = time.monotonic() + 10
    while slow_stats(server).started == started and time.monotonic() < deadline:
        time.sleep(0.005)
    assert slow_stats(server).started == started + 1 and slow_stats(server).running == 1
    return thread, started + 1


def assert_never_ran(server: ServerThread, first: threading.Thread, started: int) -> None:
    first.join()
    time.sleep(0.2)
    stats = slow_stats(server)
    assert stats.started == started, "the dropped request must not run"
    assert stats.queue_depth == 0 and stats.running == 0


def test_deadline_while_queued_never_runs(
    stub: pb_grpc.InferenceServiceStub, server: ServerThread
) -> None:
    batch, seconds = calibrate(stub)
    first, started = hold_the_instance(stub, server, batch)
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(slow_request(1), timeout=seconds / 4)
    assert info.value.code() == Code.DEADLINE_EXCEEDED
    assert_never_ran(server, first, started)
    assert_still_serving(stub)


def test_deadline_while_running(stub: pb_grpc.InferenceServiceStub) -> None:
    batch, seconds = calibrate(stub)
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(slow_request(batch), timeout=seconds / 3)
    assert info.value.code() == Code.DEADLINE_EXCEEDED
    # gRPC's deadline on the client ends the call while the run goes on; a loaded host
    # may deliver it late, though not by half a second.
    assert time.monotonic() - start < seconds / 3 + 0.5
    assert_still_serving(stub)


def test_cancelled_while_queued_never_runs(
    stub: pb_grpc.InferenceServiceStub, server: ServerThread
) -> None:
    batch, seconds = calibrate(stub)
    first, started = hold_the_instance(stub, server, batch)
    future = stub.Predict.future(slow_request(1), timeout=60)
    time.sleep(seconds / 4)
    assert slow_stats(server).running == 1, "the held run must still be running"
    assert future.cancel()
    assert_never_ran(server, first, started)
    assert_still_serving(stub)
