"""grpc.health.v1 with a drain that does not wait on Watch streams, and per-model services
that a token sees only for its own models.

A Watch stream never ends by itself, so a server that stops with a grace period would
hold every open one for the whole grace. Here, once the drain has told watchers
NOT_SERVING and the server stops taking calls, their streams end (OK), and the drain
waits only for real work. A model's service (`tensord.model.<name>`) asked for with a
token that may not use the model is NOT_FOUND, as an unknown service is. With
authentication on, a caller without a token (a load balancer) may Check or Watch a model's
service by name, but List shows it only the server's own services.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from tensord.access import may_probe, may_see
from tensord.server.intake import Intake, bounded_handlers

SERVICE = "grpc.health.v1.Health"


class HealthServicer(health.aio.HealthServicer):
    """grpc_health's asyncio servicer, plus close_watches() for the drain."""

    def __init__(self, model_prefix: str = "tensord.model.") -> None:
        super().__init__()
        self._closing = asyncio.Event()
        self._model_prefix = model_prefix

    async def _hide(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        """NOT_FOUND for another token's model's service (an anonymous caller may probe any
        model it names: load balancers do, without a token)."""
        service = request.service
        if service.startswith(self._model_prefix) and not may_probe(
            service[len(self._model_prefix) :]
        ):
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        """The service's status (NOT_FOUND for another token's model)."""
        await self._hide(request, context)
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        """Stream the service's status until the client leaves or the drain closes it."""
        await self._hide(request, context)
        watch = asyncio.ensure_future(super().Watch(request, context))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({watch, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not watch.done():
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        if not watch.cancelled():
            watch.result()  # an error of the stream itself

    async def List(self, request: Any, context: Any) -> Any:
        """Every service's status (grpc_health's asyncio servicer has no List), less the
        models the caller may not learn about (all of them, for an anonymous caller)."""
        reply = health_pb2.HealthListResponse()
        for service, status in self._server_status.items():
            prefix = self._model_prefix
            if service.startswith(prefix) and not may_see(service[len(prefix) :]):
                continue
            reply.statuses[service].status = status
        return reply

    def close_watches(self) -> None:
        """End every Watch stream, open or yet to come (at the drain, after NOT_SERVING)."""
        self._closing.set()


def add_health_servicer(servicer: HealthServicer, server: grpc.aio.Server, intake: Intake) -> None:
    """Register grpc.health.v1 as health_pb2_grpc does, but with each request received
    through the intake (a receive deadline; a drain ends calls still waiting)."""
    request, reply = health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    handlers = {
        "Check": grpc.unary_unary_rpc_method_handler(
            servicer.Check, request.FromString, reply.SerializeToString
        ),
        "List": grpc.unary_unary_rpc_method_handler(
            servicer.List,
            health_pb2.HealthListRequest.FromString,
            health_pb2.HealthListResponse.SerializeToString,
        ),
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch, request.FromString, reply.SerializeToString
        ),
    }
    bounded = bounded_handlers(handlers, intake)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, bounded),))
    server.add_registered_method_handlers(SERVICE, bounded)
