"""Server reflection: list and describe services, then call Health with no .proto at hand;
a drain does not wait for open reflection streams."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.conftest import ServerThread, serve
from tests.raw_h2 import RawConnection, frame

REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


def test_list_describe_and_call(server: ServerThread) -> None:
    with grpc.insecure_channel(server.target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {
            "tensord.v1.InferenceService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= services
        # A fresh pool: nothing here comes from the generated modules.
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName("tensord.v1.InferenceService")
        assert [m.name for m in service.methods] == [
            "Predict",
            "Generate",
            "Embed",
            "Health",
            "Info",
            "RepositoryIndex",
            "LoadModel",
            "UnloadModel",
        ]
        kserve = pool.FindServiceByName("inference.GRPCInferenceService")
        assert {"ModelInfer", "ModelMetadata", "ModelConfig"} <= {m.name for m in kserve.methods}
        assert service.methods_by_name["Generate"].server_streaming
        health = service.methods_by_name["Health"]
        request_cls = message_factory.GetMessageClass(health.input_type)
        response_cls = message_factory.GetMessageClass(health.output_type)
        call = channel.unary_unary(
            "/tensord.v1.InferenceService/Health",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_cls.FromString,
        )
        reply = call(json_format.Parse('{"model": "mlp"}', request_cls()), timeout=10)
        as_json = json_format.MessageToDict(reply)
        assert as_json["status"] == "SERVING_STATUS_SERVING"
        assert as_json["models"] == [{"name": "mlp", "version": "1", "state": "MODEL_STATE_READY"}]


def test_a_drain_is_not_held_by_reflection_streams(small_repo: Path) -> None:
    """A reflection stream waiting for its first request, and one waiting for its next,
    end with UNAVAILABLE as the drain begins; the drain does not wait out its grace."""
    srv = serve(small_repo)
    with RawConnection(srv.target) as conn:
        silent = conn.start(REFLECTION)  # headers only: it waits for its first request
        talking = conn.start(REFLECTION)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        conn.send(talking, frame(ask.SerializeToString()))
        deadline = time.monotonic() + 10
        while not conn.replies[talking].data and time.monotonic() < deadline:
            conn.pump(0.1)  # until the answer: both calls have reached their handler
        answer = conn.replies[talking].data
        assert reflection_pb2.ServerReflectionResponse.FromString(answer[5:]).HasField(
            "list_services_response"
        )
        stopper = threading.Thread(target=srv.stop, kwargs={"grace": 20.0})
        start = time.monotonic()
        stopper.start()
        replies = [conn.wait(stream, timeout=10) for stream in (silent, talking)]
        stopper.join(25)
        took = time.monotonic() - start
    for reply in replies:
        assert (reply.status, reply.message) == (
            UNAVAILABLE,
            "the server is draining; reflect on another instance",
        )
    assert took < 3, took
