"""The daemon's server: gRPC with health and reflection, model loading, graceful drain."""

from __future__ import annotations

import asyncio
import signal

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tensord import __version__
from tensord.backends.base import DeviceOptions
from tensord.config import TensordConfig
from tensord.dataplane import DataPlane
from tensord.devices import probe_gpus
from tensord.observability import Observability
from tensord.registry.registry import (
    BackendFactory,
    ModelRegistry,
    ModelState,
    default_backend_factory,
)
from tensord.server.security import Security, transport_options
from tensord.server.servicer import InferenceServicer
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc

log = structlog.get_logger("tensord.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
MODEL_HEALTH_PREFIX = "tensord.model."
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class TensordServer:
    """One daemon: start() binds and loads, stop() drains. Used by the CLI and the tests.

    Create it inside a running event loop: the grpc.aio server binds to that loop.
    """

    def __init__(
        self, config: TensordConfig, backend_factory: BackendFactory = default_backend_factory
    ) -> None:
        self.config = config
        where = DeviceOptions(
            device_id=config.server.cuda_device, cache_directory=config.cache_directory
        )
        self.registry = ModelRegistry(
            config.model_repository, backend_factory, self._models_changed, where
        )
        self.dataplane = DataPlane(self.registry)
        self.health = health.aio.HealthServicer()
        self._health_tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.observability = Observability(config, self.registry)
        self.security = Security(config, self.observability.rejected)
        self.observability.watch_stream_limit(self.security.stream_limit)
        self._server = grpc.aio.server(
            interceptors=self.security.interceptors, options=transport_options(config.server)
        )
        pb_grpc.add_InferenceServiceServicer_to_server(
            InferenceServicer(self.dataplane, self.observability.observer), self._server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )

    async def start(self) -> int:
        """Listen (health NOT_SERVING), load every model, then report SERVING. Returns the port."""
        await self._sync_health()
        self.observability.start()  # a metrics port that is taken fails before serving
        listen = self.config.server.listen
        try:
            self.port = self.security.add_port(self._server, listen)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {listen}: {exc}") from None
        await self._server.start()
        log.info(
            "server.listening",
            listen=listen,
            port=self.port,
            version=__version__,
            transport=self.security.mode,
            auth=self.security.authenticator is not None,
        )
        gpus = await asyncio.to_thread(probe_gpus)
        log.info(
            "server.devices",
            gpus=[g.name for g in gpus.gpus],
            gpu_unavailable_reason=gpus.unavailable_reason or None,
        )
        await self.registry.load_all()
        self.dataplane.serving = True
        await self._sync_health()
        counts = {state.name.lower(): 0 for state in ModelState}
        for mv in self.registry.versions():
            counts[mv.state.name.lower()] += 1
        log.info("server.ready", port=self.port, **counts)
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING, refuse new calls, let in-flight calls finish within the grace."""
        grace = self.config.server.drain_grace_seconds if grace is None else grace
        log.info("server.draining", grace_s=grace)
        self.dataplane.serving = False
        await self.health.enter_graceful_shutdown()
        if self.config.server.drain_delay_seconds:
            # Calls still arriving get UNAVAILABLE from the data plane; closing at once
            # would cancel those gRPC has taken in but not yet handed to a handler.
            await asyncio.sleep(self.config.server.drain_delay_seconds)
        await self._server.stop(grace)
        await self.registry.close()
        await asyncio.to_thread(self.observability.stop)  # joins a thread, flushes spans
        log.info("server.stopped")

    async def serve_until_signal(self) -> None:
        """Start, then drain and return on SIGTERM or SIGINT."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        await self.stop()

    def _models_changed(self) -> None:
        task = asyncio.get_running_loop().create_task(self._sync_health())
        self._health_tasks.add(task)
        task.add_done_callback(self._health_tasks.discard)

    async def _sync_health(self) -> None:
        """Keep grpc.health.v1 in step with the data plane: overall, service, per model."""
        serving = self.dataplane.serving
        overall = _SERVING if serving else _NOT_SERVING
        await self.health.set("", overall)
        await self.health.set(SERVICE_NAME, overall)
        for name in self.registry.names():
            ready = any(mv.state is ModelState.READY for mv in self.registry.get_versions(name))
            await self.health.set(
                MODEL_HEALTH_PREFIX + name, _SERVING if serving and ready else _NOT_SERVING
            )
