"""What a protocol's servicer shares: its RPCs registered to take their requests as bytes
(the intake receives, bounds and parses them), and a Predict-like call's timings."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any

import grpc
import structlog

from tensord.dataplane import PredictResult
from tensord.observability.observer import RequestObserver

log = structlog.get_logger("tensord.request")


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
