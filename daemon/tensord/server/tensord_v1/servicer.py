"""The InferenceService servicer: protobuf in, data plane, protobuf out. Nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from tensord.access import check_model
from tensord.config_tables import LimitsSettings
from tensord.dataplane import EMBEDDING, GENERATOR, PREDICT, DataPlane, TableEntry
from tensord.errors import ResourceExhaustedError
from tensord.observability.observer import RequestObserver
from tensord.server.kit.intake import Intake
from tensord.server.kit.look import Look
from tensord.server.kit.rpc import CallsInFlight, Ctx, StreamSlots, stream_rpc, unary_rpc
from tensord.server.kit.service import predict_finished, register_raw
from tensord.server.kit.tensors import INLINE_STEPS, plan_reply
from tensord.server.tensord_v1 import converters
from tensord.server.tensord_v1.codec import decode_cost
from tensord.server.tensord_v1.intake import LOOKERS
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc

log = structlog.get_logger("tensord.request")


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    """Implements tensord.v1.InferenceService over a DataPlane."""

    def __init__(
        self,
        dataplane: DataPlane,
        observer: RequestObserver | None = None,
        max_send_message_bytes: int = 0,
        limits: LimitsSettings | None = None,
        stream_slots: StreamSlots | None = None,
    ) -> None:
        self._dataplane = dataplane
        self.intake = Intake(limits or LimitsSettings())
        self.intake.lookers.update(LOOKERS)
        """Receives and bounds every call's request message before it is parsed."""
        self.calls = CallsInFlight()
        """Handlers running now (the RPC decorators count them; the drain waits on them)."""
        self.observer = observer
        """Metrics and tracing per call (the RPC decorators use it); None when both are off."""
        self.max_send_message_bytes = max_send_message_bytes
        """Largest reply gRPC will send (0: unchecked); larger Predict outputs are refused
        before they are encoded."""
        self.stream_slots = stream_slots
        """[limits] max_generate_streams; None when there is no limit."""
        self.endpoints: list[tuple[str, str]] = []
        """(protocol, address) of each protocol the server speaks, for Info; set once
        the server listens."""

    def check_model(self, rpc: str, model: str) -> None:
        """As soon as a request's model name is read: the caller may use it."""
        if rpc in ("Predict", "Generate", "Embed", "LoadModel", "UnloadModel"):
            check_model(model)

    def check_look(self, rpc: str, look: Look) -> TableEntry | None:
        """Before a request is parsed: the version a Predict or Generate call goes to
        (looked up once, here), and a Generate prompt that fits it (a longer one is never
        tokenised or converted)."""
        if rpc == "Predict":
            return self._dataplane.lookup(look.model, look.version, PREDICT, authorised=True)
        if rpc == "Embed":
            return self._dataplane.lookup(look.model, look.version, EMBEDDING, authorised=True)
        if rpc == "Generate":
            entry = self._dataplane.lookup(look.model, look.version, GENERATOR, authorised=True)
            self._dataplane.check_prompt_size(
                entry, look.prompt_bytes, look.token_ids, look.token_ids_exact
            )
            return entry
        return None

    def admitted(self, rpc: str) -> contextlib.AbstractContextManager[None]:
        """What a parsed call holds while it runs: a Generate stream's slot."""
        if rpc == "Generate" and self.stream_slots is not None:
            return self.stream_slots.held()
        return contextlib.nullcontext()

    @unary_rpc(pb.PredictRequest)
    async def Predict(
        self, request: pb.PredictRequest, context: Ctx, rid: str, target: Any
    ) -> pb.PredictResponse:
        start = time.perf_counter()
        remaining = context.time_remaining()
        if sum(decode_cost(t) for t in request.inputs) > INLINE_STEPS:
            call = await asyncio.to_thread(converters.predict_call, request, remaining)
        else:
            call = converters.predict_call(request, remaining)
        result = await self._dataplane.predict(call, target)
        contents = request.output_encoding == pb.TENSOR_ENCODING_CONTENTS
        offload = plan_reply(
            result.outputs,
            contents=contents,
            limit=self.max_send_message_bytes,
            form=" as typed contents" if contents else " as raw bytes",
            hint="ask for output_encoding RAW (more compact), or fewer outputs with output_names"
            if contents
            else "ask for fewer outputs with output_names, or send a smaller batch",
        )
        total_us = predict_finished(self.observer, "Predict", rid, result, start)
        if offload:
            return await asyncio.to_thread(converters.predict_response, result, contents, total_us)
        return converters.predict_response(result, contents, total_us)

    @unary_rpc(pb.EmbedRequest)
    async def Embed(
        self, request: pb.EmbedRequest, context: Ctx, rid: str, target: Any
    ) -> pb.EmbedResponse:
        start = time.perf_counter()
        # One id past the model's length tells a text too long; more are never looked at.
        row = target.embedding if target is not None else None
        most_ids = row.max_seq_length + 1 if row is not None else 0
        call = converters.embed_call(request, context.time_remaining(), most_ids)
        result = await self._dataplane.embed(call, target)
        size = result.vectors.nbytes + 8 * len(result.vectors) + 256
        if self.max_send_message_bytes and size > self.max_send_message_bytes:
            raise ResourceExhaustedError(
                f"the reply would take about {size} bytes, more than [server] "
                f"max_send_message_bytes ({self.max_send_message_bytes}); send fewer texts a "
                "request, or ask for fewer dimensions"
            )
        total_us = int((time.perf_counter() - start) * 1e6)
        if result.vectors.size > 65536:  # building the reply takes milliseconds
            return await asyncio.to_thread(converters.embed_response, result, total_us)
        return converters.embed_response(result, total_us)

    @unary_rpc(pb.RepositoryIndexRequest)
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Ctx, rid: str, target: Any
    ) -> pb.RepositoryIndexResponse:
        index = await self._dataplane.control.index(ready_only=request.ready)
        return converters.index_response(index)

    @unary_rpc(pb.LoadModelRequest)
    async def LoadModel(
        self, request: pb.LoadModelRequest, context: Ctx, rid: str, target: Any
    ) -> pb.LoadModelResponse:
        await self._dataplane.control.load(request.model)
        return pb.LoadModelResponse()

    @unary_rpc(pb.UnloadModelRequest)
    async def UnloadModel(
        self, request: pb.UnloadModelRequest, context: Ctx, rid: str, target: Any
    ) -> pb.UnloadModelResponse:
        return pb.UnloadModelResponse(unloaded=await self._dataplane.control.unload(request.model))

    @stream_rpc(pb.GenerateRequest)
    async def Generate(
        self, request: pb.GenerateRequest, context: Ctx, rid: str, target: Any
    ) -> AsyncIterator[pb.GenerateResponse]:
        call = converters.generate_call(request, context.time_remaining())
        async for chunk in self._dataplane.generate(call, target):
            yield converters.generate_response(chunk)

    @unary_rpc(pb.HealthRequest)
    async def Health(
        self, request: pb.HealthRequest, context: Ctx, rid: str, target: Any
    ) -> pb.HealthResponse:
        return converters.health_response(self._dataplane.health(request.model))

    @unary_rpc(pb.InfoRequest)
    async def Info(
        self, request: pb.InfoRequest, context: Ctx, rid: str, target: Any
    ) -> pb.InfoResponse:
        response = converters.info_response(await self._dataplane.info())
        response.endpoints.extend(
            pb.Endpoint(protocol=protocol, address=address) for protocol, address in self.endpoints
        )
        return response


def add_servicer(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Register the servicer as request-streaming methods that take the request's bytes
    (intake.py receives, bounds and parses the one message); on the wire they are the
    contract's unary and server-streaming methods."""
    register_raw(servicer, server, pb, "InferenceService")
