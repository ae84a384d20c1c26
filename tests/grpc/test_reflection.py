"""Server reflection: list and describe services, then call Health with no .proto at hand."""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.conftest import ServerThread


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
        assert [m.name for m in service.methods] == ["Predict", "Generate", "Health", "Info"]
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
