"""The Python client's surface against a real server, sync and asyncio alike: enums by name,
one typed error per status (still a grpc.RpcError), and the target from TENSORD_TARGET."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

import tensord_client
from tensord.server.auth import hash_token, token_entry
from tensord_client import (
    AsyncClient,
    Client,
    DataType,
    DeadlineExceeded,
    FailedPrecondition,
    FinishReason,
    InvalidArgument,
    ModelState,
    NotFound,
    ResourceExhausted,
    ServingStatus,
    TensordError,
    Unavailable,
)
from tensord_client.v1 import inference_pb2 as pb
from tests.conftest import ServerThread, serve

X = np.zeros((1, 512), np.float32)
UNREACHABLE = "127.0.0.1:9"  # the discard port: nothing listens there


def test_health_and_info_name_their_enums(client: Client) -> None:
    health = client.health()
    assert (health.status, health.serving) == ("SERVING", True)
    assert health.status is ServingStatus.SERVING and health.status.number == 1
    states = {(m.name, m.version): m.state for m in health.models}
    assert states[("mlp", 1)] is ModelState.READY and states[("broken", 1)] == "FAILED"
    assert isinstance(health.proto, pb.HealthResponse)
    assert health.proto.status == pb.SERVING_STATUS_SERVING
    assert "SERVING" in repr(health) and "proto" not in repr(health)

    info = {m.name: m for m in client.info().models}
    mlp = info["mlp"]
    assert mlp.state == "READY" and mlp.state == pb.MODEL_STATE_READY  # names equal numbers
    assert mlp.inputs[0].dtype is DataType.FLOAT32 and mlp.inputs[0].numpy_dtype == np.float32
    assert {s.dtype for s in info["identity_string"].inputs} == {"STRING"}
    assert mlp.proto.name == "mlp" and not mlp.proto.HasField("generator")
    assert info["tinylm"].generator.max_model_len > 0 and info["tinylm"].kind == "generator"


def test_generate_chunks_name_their_finish_reason(client: Client) -> None:
    chunks = list(client.generate("tinylm", token_ids=[5, 6, 7], max_tokens=4, ignore_eos=True))
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    last = chunks[-1]
    assert last.finish_reason is FinishReason.LENGTH and last.finish_reason == "LENGTH"
    assert last.usage is not None and last.usage.completion_tokens == 4
    assert sum(len(c.token_ids) for c in chunks) == 4
    assert last.proto.finish_reason == pb.FINISH_REASON_LENGTH


def test_the_asyncio_client_returns_the_same_records(server: ServerThread) -> None:
    async def run() -> tuple[Any, ...]:
        async with AsyncClient(server.target, retries=0) as c:
            health = await c.health("mlp")
            info = await c.info()
            chunks = [
                chunk
                async for chunk in c.generate(
                    "tinylm", token_ids=[5, 6], max_tokens=3, ignore_eos=True
                )
            ]
            with pytest.raises(NotFound) as missing:
                await c.predict("nope", {"input": X}, request_id="aio-1")
            with pytest.raises(FailedPrecondition) as not_generator:
                async for _ in c.generate("mlp", token_ids=[1]):
                    pass
            return health, info, chunks, missing.value, not_generator.value

    health, info, chunks, missing, not_generator = asyncio.run(run())
    assert health.status is ServingStatus.SERVING
    assert [(m.name, m.state) for m in health.models] == [("mlp", "READY")]
    assert next(m for m in info.models if m.name == "mlp").state is ModelState.READY
    assert chunks[-1].finish_reason is FinishReason.LENGTH
    for error in (missing, not_generator):
        assert isinstance(error, grpc.aio.AioRpcError)  # what asyncio code already catches
    assert missing.code() == grpc.StatusCode.NOT_FOUND and missing.request_id == "aio-1"
    assert "not a generator" in not_generator.details()


def _deadline(client: Client, request_id: str) -> None:
    stream = client.generate(
        "tinylm",
        token_ids=[5, 6],
        max_tokens=2000,
        ignore_eos=True,
        timeout=0.2,
        request_id=request_id,
    )
    for _ in stream:
        pass


Call = Callable[[Client, str], object]
CALLS: list[tuple[str, Call, type[TensordError]]] = [
    ("unknown model", lambda c, rid: c.predict("nope", {"input": X}, request_id=rid), NotFound),
    (
        "wrong shape",
        lambda c, rid: c.predict("mlp", {"input": np.zeros((1, 3), np.float32)}, request_id=rid),
        InvalidArgument,
    ),
    (
        "failed model",
        lambda c, rid: c.predict("broken", {"x": X}, request_id=rid),
        FailedPrecondition,
    ),
    (
        "not a generator",
        lambda c, rid: list(c.generate("mlp", token_ids=[1], request_id=rid)),
        FailedPrecondition,
    ),
    ("deadline", _deadline, DeadlineExceeded),
]


@pytest.mark.parametrize(("call", "expected"), [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_each_status_raises_its_own_class(
    client: Client, call: Call, expected: type[TensordError]
) -> None:
    with pytest.raises(expected) as info:
        call(client, "req-7")
    error = info.value
    assert type(error) is expected
    assert isinstance(error, TensordError) and isinstance(error, grpc.RpcError)
    code = error.code()
    assert tensord_client.errors.error_class(code) is expected
    assert str(error) == f"{code.name}: {error.details()}" and error.details()
    if expected is not DeadlineExceeded:  # a deadline passes on the client: no trailers
        assert error.request_id == "req-7"  # the daemon's echo, for its logs
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.code(), copy.details()) == (expected, code, error.details())


def test_an_unreachable_server_is_unavailable() -> None:
    with Client(UNREACHABLE, timeout=5, retries=0) as c, pytest.raises(Unavailable) as info:
        c.health()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError):  # code written for gRPC's own errors still catches it
        Client(UNREACHABLE, timeout=5, retries=0).info()


def test_a_rate_limit_raises_resource_exhausted_with_retry_after(
    small_repo: Path, tmp_path: Path
) -> None:
    token = "limited-token-dddddddddddddddddd"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(token_entry("limited", hash_token(token), ["*"], rate=1.0, burst=1))
    srv = serve(small_repo, auth__token_file=tokens)
    try:
        with Client(srv.target, timeout=10, retries=0, token=token) as c:
            c.predict("mlp", {"input": X})
            with pytest.raises(ResourceExhausted) as info:
                c.predict("mlp", {"input": X})
    finally:
        srv.stop()
    error = info.value
    assert error.retry_after is not None and 0 < error.retry_after <= 1.0
    assert error.retry_after == tensord_client.retry_after(error)
    assert error.details().endswith(f"retry in {error.retry_after:.3f} s")


def test_the_target_comes_from_tensord_target(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORD_TARGET", server.target)
    with Client(retries=0) as c:
        assert c.target == server.target and c.health().serving

    async def run() -> ServingStatus:
        async with AsyncClient(retries=0) as c:
            return (await c.health()).status

    assert asyncio.run(run()) is ServingStatus.SERVING
    with Client(UNREACHABLE, retries=0) as c:  # a target given wins
        assert c.target == UNREACHABLE
    monkeypatch.setenv("TENSORD_TARGET", "")
    with Client(retries=0) as c:
        assert c.target == tensord_client.DEFAULT_TARGET == "127.0.0.1:50051"
