"""The InferenceService servicer: protobuf in, data plane, protobuf out. Nothing else."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import structlog

from tensord.dataplane import DataPlane
from tensord.observability.observer import RequestObserver
from tensord.server import converters
from tensord.server.context import Ctx, stream_rpc, unary_rpc
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc

log = structlog.get_logger("tensord.request")


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    """Implements tensord.v1.InferenceService over a DataPlane."""

    def __init__(self, dataplane: DataPlane, observer: RequestObserver | None = None) -> None:
        self._dataplane = dataplane
        self.observer = observer
        """Metrics and tracing per call (the RPC decorators use it); None when both are off."""

    @unary_rpc
    async def Predict(
        self, request: pb.PredictRequest, context: Ctx, rid: str
    ) -> pb.PredictResponse:
        start = time.perf_counter()
        call = converters.predict_call(request, context.time_remaining())
        result = await self._dataplane.predict(call)
        total_us = int((time.perf_counter() - start) * 1e6)
        if self.observer is not None:
            self.observer.predict_timings(result.model, result.queue_s, result.compute_s)
        if log.is_enabled_for(logging.DEBUG):  # skip building the fields at info
            log.debug(
                "request.finished",
                request_id=rid,
                rpc="Predict",
                model=result.model,
                version=result.version,
                status="OK",
                queue_us=int(result.queue_s * 1e6),
                compute_us=int(result.compute_s * 1e6),
                total_us=total_us,
            )
        return converters.predict_response(result, request.output_encoding, total_us)

    @stream_rpc
    async def Generate(
        self, request: pb.GenerateRequest, context: Ctx, rid: str
    ) -> AsyncIterator[pb.GenerateResponse]:
        call = converters.generate_call(request, context.time_remaining())
        async for chunk in self._dataplane.generate(call):
            yield converters.generate_response(chunk)

    @unary_rpc
    async def Health(self, request: pb.HealthRequest, context: Ctx, rid: str) -> pb.HealthResponse:
        return converters.health_response(self._dataplane.health(request.model))

    @unary_rpc
    async def Info(self, request: pb.InfoRequest, context: Ctx, rid: str) -> pb.InfoResponse:
        return converters.info_response(self._dataplane.info())
