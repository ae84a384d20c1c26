"""The two kinds of child process the supervisor starts: the engine and a gRPC frontend.

Both are `tensord serve` with the supervisor's own arguments, so they read the same
configuration (and read it again on reload), plus `--role` and the control channel's fd.
Neither handles a signal itself: the supervisor says when to reload and when to drain, in
an order that loses no call (frontends first, then the engine). A child whose supervisor
is gone (its control channel closed) drains and exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from typing import Any

import structlog

from tensord import heap
from tensord.config import TensordConfig
from tensord.dataplane import LocalEngine, ModelTable
from tensord.errors import DeviceLostError
from tensord.observability import Observability
from tensord.procs.control import Control
from tensord.procs.engine import EngineHost
from tensord.procs.remote import RemoteEngine
from tensord.procs.ring import Ring
from tensord.server.app import EXIT_DEVICE_LOST
from tensord.server.reload import ConfigLoader, Reloader, apply_live_settings
from tensord.server.watchdog import Watchdog

log = structlog.get_logger("tensord.procs")

CHILD_WATCHDOG = "TENSORD_CHILD_WATCHDOG_S"
"""The variable by which the supervisor, itself watched by systemd, asks each child to
report alive every so many seconds: the engine as its loop turns, a frontend after each
real Health call to its own gRPC server answers (the daemon's Watchdog probe)."""


class ControlNotifier:
    """What the Watchdog tells systemd, told to the supervisor instead."""

    def __init__(self, control: Control) -> None:
        self.control = control

    def watchdog(self) -> bool:
        self.control.send({"op": "alive"})
        return True


def _child_watchdog() -> float:
    value = os.environ.get(CHILD_WATCHDOG, "")
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0


def _ignore_signals() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, lambda: None)


async def _alive(control: Control, interval: float) -> None:
    while interval and not control.closed:
        control.send({"op": "alive"})
        await asyncio.sleep(interval)


async def run_engine(
    config: TensordConfig, control_fd: int, config_loader: ConfigLoader | None
) -> int:
    """The engine process: load the repository, serve the frontends' links, reload and
    drain when told; exit EXIT_DEVICE_LOST after a sticky device error."""
    structlog.contextvars.bind_contextvars(role="engine")
    _ignore_signals()
    apply_live_settings(config)  # the GIL switch interval, as the one-process daemon
    heap.tune()
    return await EngineProcess(config, control_fd, config_loader).run()


class EngineProcess:
    """The engine process's parts: the LocalEngine behind every frontend's link, its
    metrics endpoint and the control channel the supervisor drives it through.

    Made on the running event loop: it starts the metrics endpoint and listens on the
    control channel at once."""

    def __init__(
        self, config: TensordConfig, control_fd: int, config_loader: ConfigLoader | None
    ) -> None:
        self.config = config
        self.stop = asyncio.Event()
        self.exit_code = 0
        self.engine = LocalEngine.for_config(config)
        self.host = EngineHost(self.engine, config.limits.max_generate_streams)
        self.reloader = Reloader(config_loader, self.engine.reload_models)
        self.reloader.add_hook(self.engine.apply)
        self.observability = Observability(
            config, self.engine.registry, known_model=self.engine.has_model
        )
        self.observability.start()  # on a loopback port of its own: the supervisor reads it
        self.engine.on_device_lost = self._device_lost
        self._tasks: set[asyncio.Task[Any]] = set()
        self.control = Control(socket.socket(fileno=control_fd), self._on_message, self.stop.set)
        self.host.on_dropped = self._dropped

    async def run(self) -> int:
        """Load, say ready, serve until told to drain (or the device is lost), then drain;
        returns the exit status."""
        alive = asyncio.ensure_future(_alive(self.control, _child_watchdog()))
        if await self._load():
            await self.stop.wait()
        log.info("engine.draining")
        self.host.close()
        self.engine.terminate_runs()
        await self.engine.close()
        await asyncio.to_thread(self.observability.stop)
        alive.cancel()
        self.control.close()
        log.info("engine.stopped", exit_code=self.exit_code)
        return self.exit_code

    async def _load(self) -> bool:
        """Load every model unless a drain comes first; True once loaded and said ready."""
        loading = asyncio.ensure_future(self.engine.load_models())
        await asyncio.wait(
            {loading, asyncio.ensure_future(self.stop.wait())}, return_when="FIRST_COMPLETED"
        )
        if not loading.done() or self.stop.is_set():
            loading.cancel()
            return False
        loading.result()
        seconds, frozen = heap.settle()  # the loaded heap out of every later collection
        log.info("server.heap_frozen", objects=frozen, collect_ms=round(seconds * 1e3, 1))
        self.control.send(
            {
                "op": "ready",
                "status": _status(self.engine.table),
                "metrics_port": self.observability.port,
            }
        )
        log.info("engine.ready", **self.engine.table.counts())
        return True

    def _device_lost(self, exc: DeviceLostError) -> None:
        self.exit_code = EXIT_DEVICE_LOST
        log.critical("device.lost", error=str(exc), exit_code=EXIT_DEVICE_LOST)
        self.stop.set()

    def _dropped(self, index: int) -> None:
        self.control.send({"op": "dropped", "index": index})

    def _on_message(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if op == "link":
            requests, replies = Ring.attach(*fds[:3]), Ring.attach(*fds[3:6])
            self.host.add_frontend(int(message["index"]), replies, requests)
        elif op == "unlink":
            self.host.remove_frontend(int(message["index"]))
        elif op == "reload":
            task = asyncio.ensure_future(self._reload())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif op == "drain":
            self.stop.set()

    async def _reload(self) -> None:
        """The config read again (restart-only keys kept), the engine's limits applied, the
        repository rescanned; the supervisor hears the outcome."""
        self.config, result = await self.reloader.run(self.config)
        heap.settle()
        models = result.models
        log.info(
            "engine.reloaded",
            ok=result.ok,
            config_error=result.config_error or None,
            added=models.added if models else None,
            changed=models.changed if models else None,
            removed=models.removed if models else None,
            load_failed=models.failed if models else None,
        )
        self.host.models_changed()
        self.control.send({"op": "reloaded", "status": _status(self.engine.table)})


def _status(table: ModelTable) -> str:
    counts = table.counts()
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "no models"


async def run_frontend(
    config: TensordConfig, control_fd: int, index: int, config_loader: ConfigLoader | None
) -> int:
    """A frontend process: the servers and the data plane over a RemoteEngine; it reports
    ready once it listens and the engine's table says the models are loaded."""
    from tensord.server.app import TensordServer

    structlog.contextvars.bind_contextvars(role=f"frontend-{index}")
    _ignore_signals()
    remote = RemoteEngine(config)
    server = TensordServer(config, config_loader=config_loader, engine=remote)
    server.adopt_process_settings()

    def on_message(message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if op == "link":
            remote.attach(Ring.attach(*fds[:3]), Ring.attach(*fds[3:6]))
        elif op == "engine_down":
            remote.detach()
        elif op == "reload":
            server.request_reload()
        elif op == "drain":
            server.request_stop()

    control = Control(socket.socket(fileno=control_fd), on_message, server.request_stop)
    interval = _child_watchdog()
    if interval:  # alive only while its gRPC server answers its own Health calls
        server.watchdog = Watchdog(ControlNotifier(control), interval)  # type: ignore[arg-type]
    starting = asyncio.ensure_future(server.start())
    stopping = asyncio.ensure_future(server.stop_requested())
    await asyncio.wait({starting, stopping}, return_when="FIRST_COMPLETED")
    if starting.done() and not stopping.done():
        starting.result()
        control.send(
            {"op": "ready", "port": server.port, "metrics_port": server.observability.port}
        )
        await stopping
    else:
        starting.cancel()
    await server.stop()
    control.close()
    return server.exit_code


def child_environment(config: TensordConfig) -> dict[str, str]:
    """The environment of a child: the supervisor's, without systemd's notify and
    watchdog variables (NotifyAccess=main: only the supervisor talks to systemd), and with
    its metrics on a loopback port of its own (the supervisor serves [metrics] listen)."""
    env = dict(os.environ)
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        env.pop(name, None)
    if config.metrics.enabled:
        env["TENSORD_METRICS_LISTEN"] = "127.0.0.1:0"
    return env
