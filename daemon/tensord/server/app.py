"""The daemon's server: gRPC with health and reflection, model loading, graceful drain,
systemd notifications and watchdog, reload on SIGHUP, restart after a lost device."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from grpc_health.v1 import health

from tensord import __version__, heap
from tensord.config import TensordConfig
from tensord.dataplane import (
    BackendFactory,
    DataPlane,
    EngineClient,
    LocalEngine,
    default_backend_factory,
)
from tensord.devices import probe_gpus
from tensord.errors import DeviceLostError
from tensord.eventloop import running_loop_name
from tensord.observability import Observability
from tensord.server.health import HealthPublisher, HealthServicer, add_health_servicer
from tensord.server.kserve.servicer import SERVICE_NAME as KSERVE_SERVICE_NAME
from tensord.server.kserve.servicer import KServeServicer, add_kserve_servicer
from tensord.server.notify import SystemdNotifier, watchdog_interval
from tensord.server.reflection import SERVICE_NAME as REFLECTION_SERVICE_NAME
from tensord.server.reflection import ReflectionServicer, add_reflection_servicer
from tensord.server.reload import (
    ConfigLoader,
    Reloader,
    ReloadHook,
    ReloadResult,
    apply_live_settings,
)
from tensord.server.security import Security, transport_options
from tensord.server.tensord_v1.servicer import InferenceServicer, add_servicer
from tensord.server.watchdog import Watchdog
from tensord.v1 import inference_pb2 as pb

if TYPE_CHECKING:
    from tensord.server.openai.server import OpenAIServer

log = structlog.get_logger("tensord.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
MODEL_HEALTH_PREFIX = "tensord.model."
_REPLY_LINGER_S = 0.2
"""After the last handler of a drain returns: time for its reply to leave before gRPC
stops and closes the connections, plus the replies' bytes at _REPLY_BYTES_PER_S."""
_REPLY_BYTES_PER_S = 32 * 1024 * 1024
_CLOSE_GRACE_S = 0.2
"""gRPC's grace once every handler of a drain has returned and its replies have left: a
connection still open then (its client ignores GOAWAY) is closed, not waited for."""
"""A pace a busy host's loopback or a slow client keeps up with (replies of tens of MiB
returned during the drain get a second or two more)."""
EXIT_DEVICE_LOST = 75
"""Exit status after a sticky device error (EX_TEMPFAIL): Restart=on-failure starts anew."""


class TensordServer:
    """One daemon: start() binds and loads, stop() drains. Used by the CLI and the tests.

    Create it inside a running event loop: the grpc.aio server binds to that loop.
    `config_loader` reads the configuration again on reload (file, variables, flags);
    without one a reload only rescans the model repository.
    """

    def __init__(
        self,
        config: TensordConfig,
        backend_factory: BackendFactory = default_backend_factory,
        config_loader: ConfigLoader | None = None,
        engine: EngineClient | None = None,
    ) -> None:
        self.config = config
        self.frontend = engine is not None
        """A frontend process: `engine` is the engine process, reached over a link
        (tensord.procs.remote); the port is shared with the other frontends (SO_REUSEPORT)
        and no device is touched here."""
        self.engine: EngineClient = engine or LocalEngine.for_config(config, backend_factory)
        self.registry = self.engine.registry if isinstance(self.engine, LocalEngine) else None
        """The models of this process (the metrics collectors read it; so do the tests);
        None in a frontend process."""
        self.dataplane = DataPlane(self.engine, config)
        self.dataplane.on_models_changed = self._models_changed
        self.engine.on_device_lost = self._device_lost
        self.health = HealthServicer(MODEL_HEALTH_PREFIX)
        self._health_tasks: set[asyncio.Task[None]] = set()
        self._health_publisher = HealthPublisher(
            self.health,
            self.dataplane,
            (SERVICE_NAME,),
            self._status_changed,
        )
        self.port = 0
        self.exit_code = 0
        """0 after a normal drain; EXIT_DEVICE_LOST after a sticky device error."""
        self.notifier = SystemdNotifier()
        interval = watchdog_interval()
        self.watchdog = Watchdog(self.notifier, interval) if interval else None
        self.reloader = Reloader(config_loader, self.dataplane.reload_models)
        self._reload_lock = asyncio.Lock()
        self._reload_queued = False
        self._started = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self.settles_heap = False
        """Freeze the long-lived heap after loading and after each reload (tensord.heap);
        adopt_process_settings, on the daemon's own path, turns it on."""
        self.observability = Observability(
            config, self.registry, known_model=self.dataplane.has_model
        )
        self.security = Security(config, self.observability.rejected)
        self.add_reload_hook(self._reload_security)  # certificates and tokens, on SIGHUP
        self.dataplane.generation_metrics = self.observability.generation
        self.add_reload_hook(self._apply_limits)
        self.observability.watch_stream_limit(self.security.stream_limit)
        self._server = grpc.aio.server(
            interceptors=self.security.interceptors,
            options=transport_options(config.server, reuse_port=self.frontend),
        )
        self._servicer = self._add_services()
        self._calls = self._servicer.calls
        self._intake = self._servicer.intake
        self.openai: OpenAIServer | None = (
            self._openai_server(self._servicer) if config.openai.enabled else None
        )
        """The OpenAI-compatible HTTP API ([openai] listen); None when it is off."""

    def _add_services(self) -> InferenceServicer:
        """Put tensord.v1, KServe v2, health and reflection on the gRPC server; returns
        tensord.v1's servicer, whose intake and call count the others share."""
        config = self.config
        servicer = InferenceServicer(
            self.dataplane,
            self.observability.observer,
            config.server.max_send_message_bytes,
            config.limits,
            self.security.stream_limit,
        )
        add_servicer(servicer, self._server)
        add_kserve_servicer(
            KServeServicer(
                self.dataplane,
                servicer.intake,
                servicer.calls,
                self.observability.observer,
                config.server.max_send_message_bytes,
            ),
            self._server,
        )
        add_health_servicer(self.health, self._server, servicer.intake)
        self.reflection = ReflectionServicer(
            (SERVICE_NAME, KSERVE_SERVICE_NAME, health.SERVICE_NAME, REFLECTION_SERVICE_NAME)
        )
        add_reflection_servicer(self.reflection, self._server)
        return servicer

    def _openai_server(self, servicer: InferenceServicer) -> OpenAIServer:
        """The HTTP API over the same data plane, tokens, limits and metrics as gRPC."""
        try:
            from tensord.server.openai.routes import OpenAIRoutes
            from tensord.server.openai.server import OpenAIServer
        except ImportError as exc:
            raise RuntimeError(
                f"[openai] listen is set, but the OpenAI API needs the openai-api extra "
                f"(pip install 'tensord[openai-api]'): {exc}"
            ) from None
        routes = OpenAIRoutes(
            self.dataplane,
            self.security.authenticator,
            self.observability.observer,
            servicer.intake,
            self.security.stream_limit,
            self.config.openai.max_body_bytes,
        )
        tls = self.security.tls
        context = tls.ssl_context() if tls is not None else None
        return OpenAIServer(routes, self.config.openai.listen, context, self.frontend)

    async def start(self) -> int:
        """Listen (health NOT_SERVING), load every model, then report health by the
        readiness policy ([server] ready_when) and tell systemd READY=1. Returns the port."""
        await self._sync_health()
        await self._listen()
        await self._server.start()
        self._announce_endpoints()
        self.notifier.status(f"loading models; listening on port {self.port}")
        if not self.frontend:  # a frontend holds no device: the engine process does
            gpus = await asyncio.to_thread(probe_gpus)
            log.info(
                "server.devices",
                gpus=[g.name for g in gpus.gpus],
                gpu_unavailable_reason=gpus.unavailable_reason or None,
            )
        await self.dataplane.load_models()
        if self.watchdog is not None:
            self.watchdog.start()
        if self._stop_requested.is_set():  # SIGTERM, or a device lost, while loading
            return self.port
        self._settle_heap()  # before the first request: nobody waits on it
        self.dataplane.serving = True
        await self._sync_health()
        self._report_ready()
        self._started.set()
        return self.port

    async def _listen(self) -> None:
        """Bind the metrics port, the gRPC port (and the watchdog's socket) and the HTTP
        API's port; a port that is taken fails here, before anything serves."""
        listen = self.config.server.listen
        try:
            self.observability.start()  # a metrics port that is taken fails before serving
            try:
                self.port = self.security.add_port(self._server, listen)
                if self.watchdog is not None:  # always plain: a private unix socket
                    self._server.add_insecure_port(self.watchdog.address)
            except RuntimeError as exc:
                raise OSError(f"cannot listen on {listen}: {exc}") from None
            if self.openai is not None:
                await self.openai.start()
        except BaseException:
            if self.watchdog is not None:
                self.watchdog.close()  # its socket's directory
            raise

    def _announce_endpoints(self) -> None:
        """The addresses Info lists (each gRPC service, the HTTP API), and the log line
        that says where the daemon listens."""
        listen = self.config.server.listen
        address = f"{listen.rsplit(':', 1)[0]}:{self.port}"
        self._servicer.endpoints = [(name, address) for name in self.reflection.service_names]
        if self.openai is not None:
            host = self.openai.listen.rsplit(":", 1)[0]
            scheme = "https" if self.openai.ssl_context else "http"
            self._servicer.endpoints.append(("openai", f"{scheme}://{host}:{self.openai.port}/v1"))
        log.info(
            "server.listening",
            listen=listen,
            port=self.port,
            version=__version__,
            transport=self.security.mode,
            auth=self.security.authenticator is not None,
            event_loop=running_loop_name(),
        )

    def _report_ready(self) -> None:
        """Log the models' states and tell systemd READY=1 with the status line.

        READY=1 means "started": systemd accepts `systemctl reload` (the way to fix a
        broken model) only from an active unit, and a unit that never says READY=1 is
        killed at TimeoutStartSec and restarted, which mends no model file. Whether the
        daemon serves is health's to say (and the STATUS= line's)."""
        readiness = self.dataplane.readiness()
        log.info(
            "server.ready",
            port=self.port,
            health="SERVING" if readiness.ready else "NOT_SERVING",
            ready_when=self.config.server.ready_when,
            **self.model_counts(),
        )
        self.notifier.ready(self.status_line())

    def _settle_heap(self) -> None:
        if not self.settles_heap:
            return
        seconds, frozen = heap.settle()
        log.info("server.heap_frozen", objects=frozen, collect_ms=round(seconds * 1e3, 1))

    def model_counts(self) -> dict[str, int]:
        """Model versions by state: {"loading": 0, "ready": 2, "failed": 1, "unloading": 0}."""
        return self.dataplane.model_counts()

    def status_line(self) -> str:
        """The STATUS= line systemd shows: state (and why not serving), port, model counts."""
        counts = self.model_counts()
        readiness = self.dataplane.readiness()
        state = "serving" if readiness.ready else f"not serving ({readiness.reason})"
        detail = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
        return f"{state} on port {self.port}: {detail or 'no models'}"

    def _status_changed(self) -> None:
        self.notifier.status(self.status_line())

    def add_reload_hook(self, hook: ReloadHook) -> None:
        """Run `hook(new_config)` (plain or async) on every reload, before the models are
        rescanned. It applies its new state entirely, or raises and keeps the old one."""
        self.reloader.add_hook(hook)

    async def reload(self) -> ReloadResult:
        """Re-read the config and the model repository (SIGHUP); one reload at a time."""
        async with self._reload_lock:
            self._reload_queued = False
            self.notifier.reloading("reloading the configuration and the model repository")
            log.info("server.reloading")
            self.config, result = await self.reloader.run(self.config)
            models = result.models
            log.info(
                "server.reloaded",
                ok=result.ok,
                config_error=result.config_error or None,
                ignored=sorted(result.ignored) or None,
                hook_errors=result.hook_errors or None,
                added=models.added if models else None,
                changed=models.changed if models else None,
                removed=models.removed if models else None,
                load_failed=models.failed if models else None,
                **self.model_counts(),
            )
            self._settle_heap()
            await self._sync_health()
            suffix = "" if result.ok else "; the last reload had errors (see the log)"
            self.notifier.ready(self.status_line() + suffix)
            return result

    def request_reload(self) -> None:
        """Schedule a reload (the SIGHUP handler); signals during one queue one more."""
        if self._reload_queued or self._stop_requested.is_set():
            return
        self._reload_queued = True
        self._spawn(self._reload_when_started())

    async def wait_started(self) -> None:
        """Until start-up is over: the port bound and every model loaded or failed."""
        await self._started.wait()

    async def _reload_when_started(self) -> None:
        await self._started.wait()
        if not self._stop_requested.is_set():
            await self.reload()

    def request_stop(self) -> None:
        """Ask serve_until_signal to drain and return (SIGTERM, SIGINT)."""
        self._stop_requested.set()

    def _device_lost(self, exc: DeviceLostError) -> None:
        """A sticky device error: NOT_SERVING now, then drain and exit non-zero."""
        if self.exit_code == EXIT_DEVICE_LOST:
            return
        self.exit_code = EXIT_DEVICE_LOST
        log.critical("device.lost", error=str(exc), exit_code=EXIT_DEVICE_LOST)
        self.dataplane.serving = False
        self._spawn(self._sync_health())
        self.notifier.status(f"device lost, restarting: {exc}")
        self._stop_requested.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._health_tasks.add(task)
        task.add_done_callback(self._health_tasks.discard)

    async def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING, refuse new calls, let in-flight calls finish within the grace."""
        grace = self.config.server.drain_grace_seconds if grace is None else grace
        loop = asyncio.get_running_loop()
        ends = loop.time() + grace
        log.info("server.draining", grace_s=grace)
        self._calls.draining = True  # count the replies still to leave from now on
        self._stop_requested.set()
        self.notifier.stopping(f"draining: in-flight calls get {grace:g} s")
        self.dataplane.serving = False
        self._intake.close()  # calls waiting for their message end; they never hold a drain
        self.reflection.close()  # so do reflection streams waiting for their next request
        if self.watchdog is not None:
            await self.watchdog.stop()
        await self.health.enter_graceful_shutdown()
        self.dataplane.fail_waiting_generations()  # their clients retry elsewhere at once
        if self.config.server.drain_delay_seconds:
            # Calls still arriving get UNAVAILABLE from the data plane; closing at once
            # would cancel those gRPC has taken in but not yet handed to a handler.
            await asyncio.sleep(self.config.server.drain_delay_seconds)
        # Generate streams still running shortly before the grace ends are closed with
        # UNAVAILABLE (their blocks freed), so clients see a status they can retry on,
        # not a bare cancellation.
        end_streams = loop.call_later(
            grace - min(1.0, grace / 2), lambda: self._spawn(self.dataplane.end_generations())
        )
        self.health.close_watches()  # watchers heard NOT_SERVING; they must not hold the drain
        # The HTTP API stops listening now; its requests in progress get what is left.
        openai_stopped = asyncio.ensure_future(
            self.openai.stop(max(0.0, ends - loop.time())) if self.openai else asyncio.sleep(0)
        )

        def left() -> float:
            return max(0.0, ends - loop.time())

        await self._let_handlers_finish(left)
        self._intake.stop()  # health calls still waiting for their message end too
        # Every handler has returned: what gRPC's own grace would still wait for is a
        # connection whose client ignores GOAWAY (or reads nothing), never a call.
        await self._server.stop(min(left(), _CLOSE_GRACE_S))
        await openai_stopped
        end_streams.cancel()
        # gRPC has stopped (every call answered, or cancelled as the grace ran out): a run
        # still going has nobody waiting and would hold the process until it returns.
        self.dataplane.terminate_runs()
        self._started.set()  # a reload still waiting for start-up now sees the stop
        async with self._reload_lock:  # a reload in progress finishes its loads first
            await self.dataplane.close()
        await asyncio.to_thread(self.observability.stop)  # joins a thread, flushes spans
        if self.watchdog is not None:
            self.watchdog.close()
        log.info("server.stopped", exit_code=self.exit_code)
        self.notifier.close()

    async def _let_handlers_finish(self, left: Callable[[], float]) -> None:
        """Until every handler has returned and its reply has had time to leave, within
        what `left()` says remains of the grace.

        Handlers finish while gRPC still runs: stopping it closes every connection once the
        calls are complete, and a reply returned just before (megabytes still being
        written under flow control) could be cut off with the connection."""
        if not self._calls.count:
            return
        try:
            async with asyncio.timeout(left()):
                await self._calls.wait_idle()
        except TimeoutError:
            return
        linger = _REPLY_LINGER_S + self._calls.drain_reply_bytes / _REPLY_BYTES_PER_S
        await asyncio.sleep(min(linger, left()))

    async def _reload_security(self, config: TensordConfig) -> None:
        """Re-read the certificates and the token file on a worker thread: a token file of
        megabytes takes about a second to parse, and the event loop serves meanwhile."""
        await asyncio.to_thread(self.security.reload, config)

    def _apply_limits(self, config: TensordConfig) -> None:
        self.dataplane.apply(config)
        self._intake.limits = config.limits

    def adopt_process_settings(self) -> None:
        """Run this process as the daemon runs: the GIL switch interval from the config
        (a reload applies a new one), the collector tuned, and the long-lived heap frozen
        after loading and after each reload."""
        apply_live_settings(self.config)
        heap.tune()
        self.settles_heap = True

    async def serve_until_signal(self) -> int:
        """Start; reload on SIGHUP; drain and return the exit status on SIGTERM or SIGINT,
        or after a sticky device error (then non-zero, so that systemd restarts us)."""
        loop = asyncio.get_running_loop()
        self.adopt_process_settings()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        starting = asyncio.ensure_future(self.start())
        stopping = asyncio.ensure_future(self._stop_requested.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if starting.done():
            starting.result()  # a start that failed (a port taken) raises here
            await self._stop_requested.wait()
            await self.stop()
            return self.exit_code
        # SIGTERM while models load: drain at once rather than after the loads (a TensorRT
        # build can take minutes, beyond systemd's TimeoutStopSec). A load running on a
        # worker thread cannot be interrupted (creating an ONNX Runtime session has no
        # cancel), so once the drain is done the process ends without waiting for it.
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await self.stop()
        log.info("server.exit_during_load", exit_code=self.exit_code)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.exit_code)

    def _models_changed(self) -> None:
        self._spawn(self._sync_health())

    async def stop_requested(self) -> None:
        """Until a stop is asked for (request_stop)."""
        await self._stop_requested.wait()

    async def _sync_health(self) -> None:
        await self._health_publisher.sync()
