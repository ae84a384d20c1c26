"""The InferenceService servicer: protobuf in, data plane, protobuf out. Nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Collection
from typing import Any

import grpc
import structlog

from tensord.access import check_model
from tensord.config_tables import LimitsSettings
from tensord.dataplane import GENERATOR, PREDICT, DataPlane, PredictResult, TableEntry
from tensord.errors import ResourceExhaustedError
from tensord.observability.observer import RequestObserver
from tensord.server import converters
from tensord.server.codec import decode_cost, encode_cost, encoded_size_floor
from tensord.server.context import CallsInFlight, Ctx, StreamSlots, stream_rpc, unary_rpc
from tensord.server.intake import Intake, Look
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc

log = structlog.get_logger("tensord.request")

# Tensor conversions that walk more elements than this in Python (strings, typed contents),
# or copy more bytes than this, run on a worker thread: the event loop keeps serving.
_INLINE_STEPS = 32_768
_INLINE_BYTES = 4 * 1024 * 1024


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
        if rpc in ("Predict", "Generate"):
            check_model(model)

    def check_look(self, rpc: str, look: Look) -> TableEntry | None:
        """Before a request is parsed: the version a Predict or Generate call goes to
        (looked up once, here), and a Generate prompt that fits it (a longer one is never
        tokenised or converted)."""
        if rpc == "Predict":
            return self._dataplane.lookup(look.model, look.version, PREDICT, authorised=True)
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
        if sum(decode_cost(t) for t in request.inputs) > _INLINE_STEPS:
            call = await asyncio.to_thread(converters.predict_call, request, remaining)
        else:
            call = converters.predict_call(request, remaining)
        result = await self._dataplane.predict(call, target)
        contents = request.output_encoding == pb.TENSOR_ENCODING_CONTENTS
        offload = self._plan_reply(result, contents)
        total_us = predict_finished(self.observer, "Predict", rid, result, start)
        if offload:
            return await asyncio.to_thread(converters.predict_response, result, contents, total_us)
        return converters.predict_response(result, contents, total_us)

    def _plan_reply(self, result: PredictResult, contents: bool) -> bool:
        """One walk over the outputs: RESOURCE_EXHAUSTED before encoding outputs that cannot
        fit in one message; else whether encoding them is big enough for a worker thread."""
        floor = steps = nbytes = 0
        for _, array in result.outputs:
            floor += encoded_size_floor(array, contents=contents)
            steps += encode_cost(array, contents=contents)
            nbytes += array.nbytes
        limit = self.max_send_message_bytes
        if limit and floor > limit:
            hint = (
                "ask for output_encoding RAW (more compact), or fewer outputs with output_names"
                if contents
                else "ask for fewer outputs with output_names, or send a smaller batch"
            )
            raise ResourceExhaustedError(
                f"the outputs take at least {floor} bytes as "
                f"{'typed contents' if contents else 'raw bytes'}, more than the "
                f"{limit} a reply may have (server.max_send_message_bytes); {hint}"
            )
        return steps > _INLINE_STEPS or nbytes > _INLINE_BYTES

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


def predict_finished(
    observer: RequestObserver | None, rpc: str, rid: str, result: PredictResult, start: float
) -> int:
    """A Predict-like call ran (Predict, ModelInfer): its queue and compute times to the
    metrics, a debug line; returns its microseconds since `start` (time.perf_counter)."""
    total_us = int((time.perf_counter() - start) * 1e6)
    if observer is not None:
        observer.predict_timings(result.model, result.queue_s, result.compute_s)
    if log.is_enabled_for(logging.DEBUG):  # skip building the fields at info
        log.debug(
            "request.finished",
            request_id=rid,
            rpc=rpc,
            model=result.model,
            version=result.version,
            status="OK",
            queue_us=int(result.queue_s * 1e6),
            compute_us=int(result.compute_s * 1e6),
            total_us=total_us,
        )
    return total_us


def add_servicer(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Register the servicer as request-streaming methods that take the request's bytes
    (intake.py receives, bounds and parses the one message); on the wire they are the
    contract's unary and server-streaming methods."""
    register_raw(servicer, server, pb, "InferenceService")


def register_raw(
    servicer: object,
    server: grpc.aio.Server,
    module: Any,
    service_name: str,
    methods: Collection[str] | None = None,
) -> None:
    """Register `service_name` of the generated `module` with the servicer's methods of the
    same names (all, or `methods`), each taking its request as bytes (the RPC decorators
    receive and parse it)."""
    service = module.DESCRIPTOR.services_by_name[service_name]
    handlers = {}
    for method in service.methods:
        if methods is not None and method.name not in methods:
            continue  # gRPC answers UNIMPLEMENTED
        response_type = getattr(module, method.output_type.name)
        make = (
            grpc.stream_stream_rpc_method_handler
            if method.server_streaming
            else grpc.stream_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=None,
            response_serializer=response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
