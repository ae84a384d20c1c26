"""Admission and transport limits on real gRPC servers: concurrent Generate streams, HTTP/2
streams per connection, connection age, prompt length."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tensord.config import ServerSettings
from tensord.dataplane.admission import GenerateFields, GeneratorEntry, admit
from tensord.errors import InvalidArgumentError, ResourceExhaustedError
from tensord.generate.core.sampling_params import GenerationDefaults
from tensord.server.kit.rpc import StreamSlots
from tensord.server.security import transport_options
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc
from tensord_client import Client
from tests.conftest import serve
from tests.raw_h2 import RawConnection

METHOD = "/test.Slow/Stream"


class SlowStreams:
    """A streaming method that sends one chunk, then waits for `release` to send the last."""

    def __init__(self) -> None:
        self.started = 0
        self.release = asyncio.Event()

    async def stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        self.started += 1
        yield b"first"
        await self.release.wait()
        yield b"last"

    async def serve(self, *interceptors: Any, options: Any = ()) -> tuple[grpc.aio.Server, int]:
        handler = grpc.method_handlers_generic_handler(
            "test.Slow", {"Stream": grpc.unary_stream_rpc_method_handler(self.stream)}
        )
        server = grpc.aio.server(interceptors=interceptors, options=list(options))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port


async def rest(call: Any) -> list[bytes]:
    """The remaining chunks of a stream read with read()."""
    chunks = []
    while (chunk := await call.read()) is not grpc.aio.EOF:
        chunks.append(chunk)
    return chunks


def test_stream_slots_refuse_beyond_the_limit_and_free_on_any_end() -> None:
    slots = StreamSlots(2)
    with slots.held(), slots.held():
        assert slots.active == 2
        with pytest.raises(ResourceExhaustedError) as info, slots.held():
            pass
        assert info.value.message == (
            "2 Generate streams are in progress, the most this server takes "
            "([limits] max_generate_streams = 2); retry shortly"
        )
    assert slots.active == 0
    with pytest.raises(RuntimeError), slots.held():
        raise RuntimeError("the stream failed")
    assert slots.active == 0


@pytest.mark.in_process  # reaches into the server object
def test_a_generate_stream_takes_its_slot_once_its_request_arrived(demo_repo: Path) -> None:
    """Calls whose message has not arrived hold no slot; a stream in progress does."""
    srv = serve(demo_repo, limits__max_generate_streams=1)
    request = pb.GenerateRequest(model="tinylm", prompt_token_ids=[1, 2, 3])
    request.sampling.max_tokens = 2
    try:
        assert srv.server is not None and srv.server.security.stream_limit is not None
        slots = srv.server.security.stream_limit
        with RawConnection(srv.target) as conn, grpc.insecure_channel(srv.target) as channel:
            for _ in range(3):  # headers only: the message never comes
                conn.start("/tensord.v1.InferenceService/Generate")
            conn.pump(0.2)
            stub = pb_grpc.InferenceServiceStub(channel)
            chunks = list(stub.Generate(request, timeout=10))
            assert sum(len(c.token_ids) for c in chunks) == 2
            with slots.held():  # a stream in progress holds the one slot
                with pytest.raises(grpc.RpcError) as info:
                    list(stub.Generate(request, timeout=10))
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "max_generate_streams = 1" in (info.value.details() or "")
            assert slots.active == 0
    finally:
        srv.stop()


async def test_max_concurrent_streams_queues_calls_on_one_connection() -> None:
    slow = SlowStreams()
    options = transport_options(ServerSettings(max_concurrent_streams=1))
    server, port = await slow.serve(options=options)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = channel.unary_stream(METHOD)
        first = call(b"")
        assert await first.read() == b"first"
        second = call(b"")
        await asyncio.sleep(0.5)
        assert slow.started == 1  # HTTP/2 holds the second stream at the client
        slow.release.set()
        assert await rest(first) == [b"last"]
        assert await rest(second) == [b"first", b"last"]
        assert slow.started == 2
    finally:
        await channel.close()
        await server.stop(0)


@pytest.mark.in_process  # reaches into the server object
def test_generate_passes_through_the_stream_limit(small_repo: Path) -> None:
    srv = serve(small_repo, limits__max_generate_streams=1, metrics__listen="127.0.0.1:0")
    try:
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            for _ in range(3):  # each call ends and frees its slot
                with pytest.raises(grpc.RpcError) as info:
                    list(stub.Generate(pb.GenerateRequest(model="mlp", prompt="hi"), timeout=10))
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert srv.server is not None and srv.server.security.stream_limit is not None
        limiter = srv.server.security.stream_limit
        deadline = time.monotonic() + 5  # the status reaches the client before the slot frees
        while limiter.active and time.monotonic() < deadline:
            time.sleep(0.01)
        assert limiter.active == 0
        assert srv.server.observability.metrics is not None
        registry = srv.server.observability.metrics.registry
        assert registry.get_sample_value("tensord_generate_streams_active") == 0
        refused = {"rpc": "Generate", "model": "mlp", "code": "FAILED_PRECONDITION"}
        assert registry.get_sample_value("tensord_requests_total", refused) == 3
    finally:
        srv.stop()


def test_max_connection_age_makes_clients_reconnect(small_repo: Path) -> None:
    x = np.zeros((1, 512), np.float32)

    def connections_during(target: str, seconds: float) -> int:
        ready: list[grpc.ChannelConnectivity] = []
        lock = threading.Lock()
        with Client(target, timeout=10) as client:

            def watch(state: grpc.ChannelConnectivity) -> None:
                with lock:
                    if state is grpc.ChannelConnectivity.READY:
                        ready.append(state)

            client._channel.subscribe(watch, try_to_connect=True)
            end = time.monotonic() + seconds
            while time.monotonic() < end:  # every call succeeds across the reconnections
                assert client.predict("mlp", {"input": x})["output"].shape == (1, 10)
                time.sleep(0.02)
            client._channel.unsubscribe(watch)
        return len(ready)

    aged = serve(small_repo, server__max_connection_age_seconds=0.5)
    plain = serve(small_repo)
    try:
        assert connections_during(aged.target, 2.5) >= 3
        assert connections_during(plain.target, 1.0) == 1
    finally:
        aged.stop()
        plain.stop()


def test_transport_options_from_the_settings() -> None:
    settings = ServerSettings(
        max_receive_message_bytes=2048,
        max_send_message_bytes=4096,
        max_concurrent_streams=64,
        keepalive_time_seconds=30,
        keepalive_timeout_seconds=5,
        keepalive_min_client_interval_seconds=2.5,
        max_connection_age_seconds=300,
        max_connection_age_grace_seconds=60,
    )
    assert dict(transport_options(settings)) == {
        "grpc.max_receive_message_length": 2048,
        "grpc.max_send_message_length": 4096,
        "grpc.so_reuseport": 0,
        "grpc.keepalive_time_ms": 30_000,
        "grpc.keepalive_timeout_ms": 5_000,
        "grpc.http2.min_ping_interval_without_data_ms": 2_500,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.max_concurrent_streams": 64,
        "grpc.max_connection_age_ms": 300_000,
        "grpc.max_connection_age_grace_ms": 60_000,
    }
    defaults = dict(transport_options(ServerSettings()))
    assert "grpc.max_connection_age_ms" not in defaults
    assert "grpc.max_concurrent_streams" not in defaults
    assert defaults["grpc.keepalive_time_ms"] == 60_000


def _prompt(count: int, max_prompt_tokens: int, context: int) -> None:
    """Admit a prompt of `count` token ids to a generator of that context."""
    entry = GeneratorEntry("llm", context, 32_000, 16, GenerationDefaults(), max_prompt_tokens)
    admit(GenerateFields(token_ids=count, prompt_token_ids=[1] * count), entry)


def test_prompt_token_limit() -> None:
    _prompt(4096, 4096, 8192)
    _prompt(10_000, 0, 20_000)  # no server limit
    with pytest.raises(InvalidArgumentError) as info:
        _prompt(4097, 4096, 8192)
    assert info.value.message == (
        "the prompt has 4097 tokens, more than the 4096 this server accepts "
        "([limits] max_prompt_tokens); shorten it"
    )
    with pytest.raises(InvalidArgumentError) as info:
        _prompt(2048, 0, 2048)
    assert info.value.message == (
        "the prompt has 2048 tokens; the model's context is 2048 tokens, so a prompt may "
        "have at most 2047"
    )
