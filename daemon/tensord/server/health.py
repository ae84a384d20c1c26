"""grpc.health.v1 with a drain that does not wait on Watch streams, per-model services
that a token sees only for its own models, and the publisher that keeps it in step with the
data plane.

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
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2

from tensord.access import may_probe, may_see
from tensord.dataplane import DataPlane, Readiness
from tensord.server.kit.intake import Intake, bounded_handlers

log = structlog.get_logger("tensord.server")

SERVICE = "grpc.health.v1.Health"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer(health.aio.HealthServicer):
    """grpc_health's asyncio servicer, plus close_watches() for the drain."""

    def __init__(self, model_prefix: str = "tensord.model.") -> None:
        super().__init__()
        self._closing = asyncio.Event()
        self.model_prefix = model_prefix
        """The prefix of each model's service name."""

    async def _hide(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        """NOT_FOUND for another token's model's service (an anonymous caller may probe any
        model it names: load balancers do, without a token)."""
        service = request.service
        if service.startswith(self.model_prefix) and not may_probe(
            service[len(self.model_prefix) :]
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
            prefix = self.model_prefix
            if service.startswith(prefix) and not may_see(service[len(prefix) :]):
                continue
            reply.statuses[service].status = status
        return reply

    def close_watches(self) -> None:
        """End every Watch stream, open or yet to come (at the drain, after NOT_SERVING)."""
        self._closing.set()


class HealthPublisher:
    """Sets the statuses grpc.health.v1 reports: the server's ("" and each of `services`)
    by the readiness policy, each model's (`<prefix><name>`) SERVING while it has a READY
    version and calls are taken. Logs the server's verdict when it turns."""

    def __init__(
        self,
        servicer: HealthServicer,
        dataplane: DataPlane,
        services: Sequence[str],
        status_changed: Callable[[], None],
    ) -> None:
        self._servicer = servicer
        self._dataplane = dataplane
        self._services = ("", *services)
        self._status_changed = status_changed
        """Called when the verdict turns after start-up (the server updates systemd's
        STATUS= line)."""
        self._announced: set[str] = set()
        self._said: Readiness | None = None
        """The verdict last published once calls were taken."""

    async def sync(self) -> None:
        """Publish the current statuses (after every change of a model's state, a reload,
        the start and the drain)."""
        dataplane, servicer = self._dataplane, self._servicer
        readiness = dataplane.readiness()
        self._tell(readiness)
        overall = _SERVING if readiness.ready else _NOT_SERVING
        for service in self._services:
            await servicer.set(service, overall)
        prefix = servicer.model_prefix
        models = dataplane.models_serving()
        for name, serving in models:
            await servicer.set(prefix + name, _SERVING if serving else _NOT_SERVING)
        names = [name for name, _ in models]
        for name in self._announced.difference(names):  # removed by a reload
            await servicer.set(prefix + name, _NOT_SERVING)
        self._announced.update(names)

    def _tell(self, readiness: Readiness) -> None:
        """Once calls are taken, log the verdict when it turns (and at first when it is
        NOT_SERVING, with the reason), and report the turn."""
        if not self._dataplane.serving:
            return  # starting or draining: the server logs those itself
        before, self._said = self._said, readiness
        if before is not None and before.ready == readiness.ready:
            return
        policy = self._dataplane.ready_when
        if not readiness.ready:
            log.warning(
                "server.not_serving",
                reason=readiness.reason,
                ready_when=policy,
                hint="fix the models (Health and the model.failed log lines say why) and "
                "reload (SIGHUP), or see [server] ready_when",
            )
        elif before is not None:
            log.info("server.serving", ready_when=policy)
        if before is not None:  # at start-up, READY=1 carries the first STATUS= line
            self._status_changed()


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
