"""Request intake on a real server: messages that never come or come incomplete (raw HTTP/2),
limits applied before parsing, and a drain that calls waiting for their message never hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from tensord.server.auth import hash_token, token_entry
from tensord.v1 import inference_pb2 as pb
from tests.conftest import ServerThread, serve
from tests.fuzzing import field, varint
from tests.raw_h2 import RawConnection

PREDICT = "/tensord.v1.InferenceService/Predict"
GENERATE = "/tensord.v1.InferenceService/Generate"
HEALTH = "/tensord.v1.InferenceService/Health"
INVALID, DEADLINE = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED
EXHAUSTED, DENIED = grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED


EMPTY_TENSOR = field(3, field(3, b"\0"))
"""An inputs entry holding Tensor{shape: [0]}: five bytes."""


@pytest.fixture(scope="module")
def server(demo_repo: Path) -> Iterator[ServerThread]:
    srv = serve(
        demo_repo,
        limits__receive_timeout_seconds=0.5,
        limits__max_request_fields=1000,
        limits__max_tensors_per_request=8,
    )
    yield srv
    srv.stop()


def raw_call(srv: ServerThread, method: str, data: bytes, stream: bool = False) -> grpc.RpcError:
    """The error a call of `data` (bytes as they are) ends with."""
    options = [("grpc.max_send_message_length", 1 << 28)]
    with grpc.insecure_channel(srv.target, options=options) as channel:
        if stream:
            call = channel.unary_stream(method, request_serializer=None)
            with pytest.raises(grpc.RpcError) as info:
                list(call(data, timeout=30))
        else:
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(method, request_serializer=None)(data, timeout=30)
    return info.value  # type: ignore[return-value]


def test_a_call_that_ends_without_its_message(server: ServerThread) -> None:
    with RawConnection(server.target) as conn:
        for method in (PREDICT, GENERATE, HEALTH):
            reply = conn.wait(conn.start(method, end_stream=True))
            assert (reply.status, reply.message) == (
                INVALID.value[0],
                "the call ended without a request message; send exactly one",
            )


def test_a_message_shorter_than_its_length_prefix(server: ServerThread) -> None:
    with RawConnection(server.target) as conn:
        stream = conn.start(PREDICT)
        conn.send(stream, b"\0\0\0\0\x64" + b"\x0a\x03mlp", end_stream=True)  # 100 claimed
        reply = conn.wait(stream)
        assert reply.status == INVALID.value[0], (reply.status, reply.message)


def test_a_message_that_never_comes(server: ServerThread) -> None:
    with RawConnection(server.target) as conn:
        start = time.monotonic()
        reply = conn.wait(conn.start(PREDICT), timeout=5)
        took = time.monotonic() - start
    assert (reply.status, reply.message) == (
        DEADLINE.value[0],
        "the request message did not arrive within 0.5 s ([limits] receive_timeout_seconds)",
    )
    assert 0.5 <= took < 2


def test_more_tensors_than_allowed_are_refused_before_parsing(server: ServerThread) -> None:
    data = field(1, b"mlp") + EMPTY_TENSOR * 100_000
    error = raw_call(server, PREDICT, data)
    assert error.code() == INVALID
    assert error.details() == (
        "the request has more than 8 input tensors; a request takes at most 8 ([limits] "
        "max_tensors_per_request)"
    )
    names = raw_call(server, PREDICT, field(1, b"mlp") + field(4, b"y") * 9)
    assert "more than 8 output names" in names.details()


def test_more_fields_than_allowed_are_refused_before_parsing(server: ServerThread) -> None:
    """One tensor whose values are sent unpacked: a field per value."""
    values = b"".join(field(4, b"\0\0\0\0") for _ in range(2000))  # fixed32 would do too
    tensor = field(1, b"input") + field(2, 9) + field(3, varint(2000)) + field(5, values)
    error = raw_call(server, PREDICT, field(1, b"mlp") + field(3, tensor))
    assert error.code() == EXHAUSTED
    assert error.details().startswith(
        "the request holds more than 1000 protobuf fields ([limits] max_request_fields)"
    )


def test_bytes_that_are_not_the_message(server: ServerThread) -> None:
    for data in (b"\x0a\xff\xff\xff\x7f", b"\x07garbage", b"\x0b"):
        error = raw_call(server, PREDICT, data)
        assert error.code() == INVALID, data
        assert "is not a valid tensord.v1.PredictRequest message" in error.details()


def test_prompts_too_long_for_the_model_are_never_tokenized(server: ServerThread) -> None:
    """tinylm's context is 2048 tokens: 3 MB of text, 2 million ids (packed and not)."""
    text = field(1, b"tinylm") + field(3, b"hello world " * 250_000)
    error = raw_call(server, GENERATE, text, stream=True)
    assert error.code() == INVALID
    assert error.details().startswith("the prompt takes 3000000 bytes, so it has at least ")
    assert "a prompt may have (the model's context of 2048 tokens)" in error.details()
    packed = field(1, b"tinylm") + field(4, varint(1000) * 2_000_000)
    error = raw_call(server, GENERATE, packed, stream=True)
    assert error.code() == INVALID
    assert "the prompt has 2000000 tokens" in error.details()
    unpacked = field(1, b"tinylm") + field(4, 7) * 3000  # past the field budget first
    assert raw_call(server, GENERATE, unpacked, stream=True).code() == EXHAUSTED
    sampling = field(1, b"tinylm") + field(3, b"hi") + field(5, field(7, b"x" * 1_100_000))
    error = raw_call(server, GENERATE, sampling, stream=True)
    assert error.details().startswith("sampling takes more than 1048576 bytes; sampling")
    # protobuf merges repeated occurrences of a message field: their sizes add up
    merged = field(1, b"tinylm") + field(5, field(8, varint(5) * 400_000)) * 3
    error = raw_call(server, GENERATE, merged, stream=True)
    assert error.details().startswith("sampling takes more than 1048576 bytes; sampling")


def test_a_generate_for_another_model_is_refused_before_parsing(server: ServerThread) -> None:
    """Whatever model a Generate names, its prompt is never parsed unless that model can
    take it: a missing model, version or a predict model answer as Generate would."""
    ids = field(4, varint(1) * 2_000_000)
    for model, version, code, start in (
        (b"nosuch", 0, grpc.StatusCode.NOT_FOUND, "model 'nosuch' not found"),
        (b"tinylm", 7, grpc.StatusCode.NOT_FOUND, "model 'tinylm' has no version 7"),
        (b"mlp", 0, grpc.StatusCode.FAILED_PRECONDITION, "model 'mlp' is a predict model"),
    ):
        data = field(1, model) + (field(2, version) if version else b"") + ids
        error = raw_call(server, GENERATE, data, stream=True)
        assert (error.code(), error.details()[: len(start)]) == (code, start), error.details()


def test_only_the_last_prompt_counts(server: ServerThread) -> None:
    """protobuf keeps the last occurrence of a string field: a long prompt followed by a
    short one is the short one."""
    data = field(1, b"tinylm") + field(3, b"x" * 200_000) + field(3, b"hi")
    data += field(5, field(1, 2))  # max_tokens 2
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_stream(
            GENERATE, request_serializer=None, response_deserializer=pb.GenerateResponse.FromString
        )
        chunks = list(call(data, timeout=30))
    assert sum(len(c.token_ids) for c in chunks) == 2


def test_shapes_and_names_are_bounded_before_parsing(server: ServerThread) -> None:
    tensor = field(1, b"input") + field(2, 9) + field(3, varint(1) * 1_000_000)
    error = raw_call(server, PREDICT, field(1, b"mlp") + field(3, tensor))
    assert error.code() == INVALID
    assert error.details() == (
        "inputs[0] 'input': shape has rank 1000000; at most 64 dimensions are supported"
    )
    long_name = b"m" * 5000
    error = raw_call(server, PREDICT, field(1, long_name) + EMPTY_TENSOR)
    assert error.code() == INVALID
    assert error.details() == "the model name takes 5000 bytes; names are at most 4096 bytes"
    error = raw_call(server, PREDICT, field(1, b"mlp") + field(3, field(1, long_name)))
    assert error.details() == "inputs[0]'s name takes 5000 bytes; names are at most 4096 bytes"
    error = raw_call(server, PREDICT, field(1, b"mlp") + field(4, long_name))
    assert error.details() == "output_names[0] takes 5000 bytes; names are at most 4096 bytes"


def test_an_info_request_with_unknown_fields_is_answered(server: ServerThread) -> None:
    """InfoRequest has no fields: whatever unknown ones it carries are skipped, as protobuf
    skips them."""
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary(
            "/tensord.v1.InferenceService/Info",
            request_serializer=None,
            response_deserializer=pb.InfoResponse.FromString,
        )
        for data in (field(1, 7), field(1, b"\xff\xfe"), field(9, b"x")):
            assert call(data, timeout=10).models


def test_typed_integers_are_bounded_and_counted_at_their_parsed_size(demo_repo: Path) -> None:
    """Typed bool and integer values cost the parser time and 8 bytes each once parsed:
    [limits] max_typed_integers bounds them, and the in-flight budget counts them so."""
    srv = serve(
        demo_repo, limits__max_typed_integers=1000, limits__max_request_bytes_in_flight=100_000
    )

    def request(count: int) -> bytes:
        contents = field(3, varint(1) * count)  # int64_values, packed one-byte varints
        tensor = field(1, b"input") + field(2, 7) + field(3, varint(count)) + field(5, contents)
        return field(1, b"mlp") + field(3, tensor)

    try:
        error = raw_call(srv, PREDICT, request(1001))
        assert error.code() == INVALID
        assert error.details() == (
            "the request carries more than 1000 bool and integer values as typed contents "
            "([limits] max_typed_integers); send tensors this large as raw_data"
        )
        error = raw_call(srv, PREDICT, request(999))
        assert error.code() == INVALID  # an int64 tensor for a float input: it was parsed
    finally:
        srv.stop()
    srv = serve(demo_repo, limits__max_typed_integers=0, limits__max_request_bytes_in_flight=10_000)
    try:
        error = raw_call(srv, PREDICT, request(2000))  # 2 KB on the wire, 16 KB parsed
        assert error.code() == EXHAUSTED
        assert "this one (18" in error.details(), error.details()
    finally:
        srv.stop()


def test_the_bytes_in_flight_are_bounded(demo_repo: Path) -> None:
    srv = serve(demo_repo, limits__max_request_bytes_in_flight=100_000)
    try:
        x = np.zeros((64, 512), np.float32)  # 131 KB raw
        request = pb.PredictRequest(model="mlp")
        request.inputs.add(name="input", dtype=pb.DATA_TYPE_FLOAT32, shape=x.shape)
        request.inputs[0].raw_data = x.tobytes()
        error = raw_call(srv, PREDICT, request.SerializeToString())
        assert error.code() == EXHAUSTED
        assert error.details().startswith(
            "requests holding 0 bytes are in progress; this one (131099 bytes) would pass "
            "the 100000 the server holds at once ([limits] max_request_bytes_in_flight)"
        )
        small = pb.PredictRequest(model="mlp")
        small.inputs.add(name="input", dtype=pb.DATA_TYPE_FLOAT32, shape=(1, 512))
        small.inputs[0].raw_data = x[:1].tobytes()
        with grpc.insecure_channel(srv.target) as channel:
            channel.unary_unary(PREDICT, request_serializer=None)(small.SerializeToString())
    finally:
        srv.stop()


def test_permission_is_checked_before_the_request_is_counted(
    demo_repo: Path, tmp_path: Path
) -> None:
    """A token that may not use the model learns nothing else: not even that its request
    holds too many tensors."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(token_entry("cnn-only", hash_token("cnn-only-token-" + "c" * 20), ["cnn"]))
    srv = serve(demo_repo, auth__token_file=tokens)
    try:
        data = field(1, b"mlp") + EMPTY_TENSOR * 1_000_000
        with grpc.insecure_channel(srv.target) as channel:
            call = channel.unary_unary(PREDICT, request_serializer=None)
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                call(data, metadata=(("authorization", "Bearer cnn-only-token-" + "c" * 20),))
        assert info.value.code() == DENIED  # type: ignore[attr-defined]
        assert time.monotonic() - start < 2
    finally:
        srv.stop()


def test_a_drain_is_not_held_by_calls_waiting_for_their_message(demo_repo: Path) -> None:
    srv = serve(demo_repo)  # the default 30 s to receive
    with RawConnection(srv.target) as conn:
        waiting = conn.start(PREDICT)
        # A call answered after it on the same connection: the server has taken both in,
        # in order, so the waiting call is in its handler (a fixed pause was not enough on
        # a loaded host: a call not yet handed to a handler is cancelled by the stop).
        probe = conn.start(HEALTH)
        conn.send(probe, b"\0\0\0\0\0", end_stream=True)
        assert conn.wait(probe, timeout=10).status == 0
        stopper = threading.Thread(target=srv.stop, kwargs={"grace": 20.0})
        start = time.monotonic()
        stopper.start()
        reply = conn.wait(waiting, timeout=10)
        stopper.join(25)
        took = time.monotonic() - start
    assert reply.status == grpc.StatusCode.UNAVAILABLE.value[0], (reply.status, reply.message)
    assert took < 3, took


def test_a_typed_request_too_large_for_one_conversion(server: ServerThread) -> None:
    """Typed contents of 128 x 512 floats convert in chunks, to the same values."""
    values = np.arange(128 * 512, dtype=np.float32) / 7
    request = pb.PredictRequest(model="mlp")
    tensor = request.inputs.add(name="input", dtype=pb.DATA_TYPE_FLOAT32, shape=(128, 512))
    tensor.contents.float_values.extend(values.tolist())
    raw = request.inputs[0]
    raw_request = pb.PredictRequest(model="mlp")
    raw_request.inputs.add(name="input", dtype=pb.DATA_TYPE_FLOAT32, shape=(128, 512))
    raw_request.inputs[0].raw_data = values.tobytes()
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary(PREDICT, response_deserializer=pb.PredictResponse.FromString)
        typed_reply = call(request.SerializeToString(), timeout=30)
        raw_reply = call(raw_request.SerializeToString(), timeout=30)
    assert raw.contents.float_values and typed_reply.outputs[0].raw_data == (
        raw_reply.outputs[0].raw_data
    )


def test_a_corrupt_compressed_message_is_refused_by_grpc(server: ServerThread) -> None:
    """gRPC itself decompresses before tensord sees the bytes: INTERNAL, as the README's
    error table says."""
    with RawConnection(server.target) as conn:
        stream = conn.start(HEALTH, extra=(("grpc-encoding", "gzip"),))
        conn.send(stream, b"\x01\0\0\0\x05junk!", end_stream=True)
        reply = conn.wait(stream)
    assert reply.status == grpc.StatusCode.INTERNAL.value[0]
    assert reply.message.startswith("Decompression failed")


def test_grpc_health_takes_its_message_the_same_way(demo_repo: Path) -> None:
    """grpc.health.v1 too: a call without a message is answered, and one waiting for it
    does not hold the drain."""
    srv = serve(demo_repo)
    with RawConnection(srv.target) as conn:
        reply = conn.wait(conn.start("/grpc.health.v1.Health/Check", end_stream=True))
        assert reply.status == INVALID.value[0], (reply.status, reply.message)
        waiting = conn.start("/grpc.health.v1.Health/Watch")
        conn.pump(0.3)
        stopper = threading.Thread(target=srv.stop, kwargs={"grace": 20.0})
        start = time.monotonic()
        stopper.start()
        reply = conn.wait(waiting, timeout=10)
        stopper.join(25)
    assert reply.status == grpc.StatusCode.UNAVAILABLE.value[0], (reply.status, reply.message)
    assert time.monotonic() - start < 3
