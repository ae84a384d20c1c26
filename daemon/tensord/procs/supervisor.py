"""The supervisor: `tensord serve` with `[server] frontends` above 0.

It holds the port and an instance lock, starts one engine process and N frontend
processes (before any gRPC or CUDA state exists in it), joins each frontend to the engine
by a pair of rings, and speaks for them all to systemd: READY once every process is ready,
STATUS from the engine, WATCHDOG while every child reports in. SIGHUP reloads the engine
and the frontends; SIGTERM drains the frontends (their calls finish), then the engine. An
engine that dies is started again while frontends answer UNAVAILABLE; after
`MAX_ENGINE_RESTARTS` in `RESTART_WINDOW_S` the daemon exits non-zero for systemd to act.
A frontend that dies is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from tensord.config import TensordConfig
from tensord.procs import control as control_channel
from tensord.procs.children import CHILD_WATCHDOG, child_environment
from tensord.procs.control import Control
from tensord.procs.ring import MAX_CAPACITY, Ring
from tensord.server.notify import SystemdNotifier, watchdog_interval
from tensord.server.reload import Reloader

log = structlog.get_logger("tensord.supervisor")

MAX_ENGINE_RESTARTS = 3
RESTART_WINDOW_S = 60.0
MAX_FRONTEND_RESTARTS = 5
"""Frontend deaths in RESTART_WINDOW_S, whichever frontends, after which the daemon gives
up (a frontend that cannot start, say with a port or certificate it cannot use)."""
EXIT_CHILDREN_FAILING = 4
"""The exit status after the engine died MAX_ENGINE_RESTARTS times in RESTART_WINDOW_S, or
the frontends MAX_FRONTEND_RESTARTS times."""
_RING_SLACK = 1 << 20
_KILL_AFTER_S = 10.0
"""How long a child may take past its drain before it is killed."""


RING_MACHINES = frozenset({"x86_64", "amd64", "AMD64"})
"""Where the rings between frontends and the engine are safe (ring.py: their ordering rests
on x86-64 keeping a store behind the loads before it; Python has no fence elsewhere)."""


def frontend_count(
    config: TensordConfig, cores: int | None = None, machine: str | None = None
) -> int:
    """`[server] frontends` as a number: `auto` is none below 8 cores, else one per two
    cores past the first four (the engine, its lanes and the system keep those), and none
    off x86-64, where a number above 0 is refused (RuntimeError) with the reason."""
    value = config.server.frontends
    machine = machine or platform.machine()
    if machine not in RING_MACHINES:
        if value != "auto" and int(value) > 0:
            raise RuntimeError(
                f"[server] frontends = {value} needs an x86-64 host, and this one is "
                f"{machine}: the shared-memory rings between the frontends and the engine "
                "rely on x86-64's memory ordering, which Python cannot enforce elsewhere; "
                "set [server] frontends = 0 (one process serves everything)"
            )
        return 0
    if value != "auto":
        return int(value)
    cores = cores or len(os.sched_getaffinity(0))
    return 0 if cores < 8 else max(2, (cores - 4) // 2)


def ring_capacity(message_bytes: int) -> int:
    """A ring that holds two of the largest messages (a power of two)."""
    need = 2 * (message_bytes + _RING_SLACK)
    return min(MAX_CAPACITY, 1 << (need - 1).bit_length())


def hold_port(listen: str) -> tuple[socket.socket, int]:
    """A socket bound (not listening) to `listen` with SO_REUSEPORT, which the frontends
    share; the port it got."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    return sock, int(sock.getsockname()[1])


def instance_lock(port: int) -> Any:
    """An exclusive lock on this port's lock file, so that a second daemon (which could
    share a SO_REUSEPORT port) refuses to start."""
    directory = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or tempfile.gettempdir()
    path = Path(directory) / f"tensord-port-{port}.lock"
    handle = open(path, "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise OSError(f"cannot listen on port {port}: another tensord serves it ({path})") from None
    return handle


@dataclass
class Child:
    """One child process and its control channel."""

    role: str
    index: int
    process: subprocess.Popen[bytes]
    control: Control
    ready: bool = False
    alive_at: float = field(default_factory=time.monotonic)
    status: str = ""
    metrics_port: int = 0
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the process has exited (its pidfd was readable)."""


class Supervisor:
    """Runs the processes of one daemon until SIGTERM or SIGINT; `run` returns the exit
    status."""

    def __init__(
        self,
        config: TensordConfig,
        serve_args: list[str],
        frontends: int,
        config_loader: Callable[[], TensordConfig] | None = None,
    ) -> None:
        self.config = config
        self.reloader = Reloader(config_loader)
        """Reads the configuration again on SIGHUP (the drain settings are live)."""
        self.serve_args = serve_args
        """`tensord serve`'s arguments, given again to each child (without --listen)."""
        self.count = frontends
        self.notifier = SystemdNotifier()
        self.engine: Child | None = None
        self.frontends: dict[int, Child] = {}
        self.port = 0
        self.stopping = False
        self.exit_code = 0
        self._listen = ""
        self._openai = ""
        self._engine_deaths: list[float] = []
        self._frontend_deaths: list[float] = []
        self._stop = asyncio.Event()
        self._announced = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watchdog = watchdog_interval() or 0.0
        """Seconds between WATCHDOG=1 (half of WatchdogSec); 0 without a watchdog."""
        self._child_watchdog = self._watchdog / 2
        """How often each child reports alive: twice per keep-alive."""

    # Children.

    def _spawn(self, role: str, index: int) -> Child:
        ours, theirs = control_channel.pair()
        argv = [sys.executable, "-m", "tensord", "serve", *self.serve_args]
        argv += ["--listen", self._listen, "--role", role, "--control-fd", str(theirs.fileno())]
        if role == "frontend":
            argv += ["--frontend-index", str(index)]
        env = child_environment(self.config)
        if self._child_watchdog:
            env[CHILD_WATCHDOG] = str(self._child_watchdog)
        if self._openai:
            env["TENSORD_OPENAI_LISTEN"] = self._openai
        process = subprocess.Popen(
            argv, pass_fds=[theirs.fileno()], env=env, start_new_session=True
        )
        theirs.close()
        child: Child | None = None

        def on_message(message: dict[str, Any], fds: list[int]) -> None:
            assert child is not None
            self._heard(child, message)

        control = Control(ours, on_message, lambda: None)
        child = Child(role, index, process, control)
        pidfd = os.pidfd_open(process.pid)
        loop = asyncio.get_running_loop()

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            assert child is not None
            self._exited(child)

        loop.add_reader(pidfd, exited)
        log.info("supervisor.started_child", role=role, index=index, pid=process.pid)
        return child

    def _link(self, index: int) -> None:
        """Join frontend `index` to the engine with a new pair of rings."""
        server = self.config.server
        requests = Ring.create(ring_capacity(server.max_receive_message_bytes), "tensord-requests")
        replies = Ring.create(ring_capacity(server.max_send_message_bytes), "tensord-replies")
        fds = [*requests.fds(), *replies.fds()]
        try:
            if self.engine is not None:
                self.engine.control.send({"op": "link", "index": index}, fds)
            frontend = self.frontends.get(index)
            if frontend is not None:
                frontend.control.send({"op": "link", "index": index}, fds)
        finally:
            requests.close()  # the children hold their own copies
            replies.close()

    def _heard(self, child: Child, message: dict[str, Any]) -> None:
        op = message.get("op")
        child.alive_at = time.monotonic()
        if op == "ready":
            child.ready = True
            child.status = str(message.get("status", ""))
            child.metrics_port = int(message.get("metrics_port") or 0)
            log.info("supervisor.child_ready", role=child.role, index=child.index)
            self._announce()
        elif op == "reloaded":
            child.status = str(message.get("status", child.status))
            self.notifier.ready(self.status_line())
        elif op == "dropped":  # the engine gave up on a frontend that stopped reading
            frontend = self.frontends.get(int(message.get("index", -1)))
            if frontend is not None and frontend.process.poll() is None:
                log.error("supervisor.frontend_not_reading", index=frontend.index,
                          pid=frontend.process.pid)  # fmt: skip
                frontend.process.kill()  # its exit starts it again

    def _exited(self, child: Child) -> None:
        code = child.process.wait()
        child.gone.set()
        child.control.close()
        if self.stopping:
            return
        log.error("supervisor.child_exited", role=child.role, index=child.index, exit_code=code)
        if child.role == "engine":
            for frontend in self.frontends.values():
                frontend.control.send({"op": "engine_down"})
            if self._gives_up(self._engine_deaths, MAX_ENGINE_RESTARTS, "engine"):
                return
            self.notifier.status("the engine process exited; restarting it")
            self.engine = self._spawn("engine", 0)
            for index in self.frontends:
                self._link(index)
        else:
            if self._gives_up(self._frontend_deaths, MAX_FRONTEND_RESTARTS, "frontends"):
                return
            self.frontends[child.index] = self._spawn("frontend", child.index)
            self._link(child.index)

    def _gives_up(self, deaths: list[float], limit: int, role: str) -> bool:
        """Count one more death in `deaths` (those of the last RESTART_WINDOW_S); at `limit`
        the daemon stops with EXIT_CHILDREN_FAILING rather than start the child again."""
        now = time.monotonic()
        deaths[:] = [t for t in deaths if now - t < RESTART_WINDOW_S] + [now]
        if len(deaths) < limit:
            return False
        log.critical(
            f"supervisor.{role}_failing",
            restarts=len(deaths),
            window_s=RESTART_WINDOW_S,
            exit_code=EXIT_CHILDREN_FAILING,
        )
        self.exit_code = EXIT_CHILDREN_FAILING
        self._stop.set()
        return True

    def _announce(self) -> None:
        children = [self.engine, *self.frontends.values()]
        if not all(c is not None and c.ready for c in children):
            return
        if not self._announced:
            self._announced = True
            log.info("supervisor.ready", port=self.port, frontends=self.count)
        self.notifier.ready(self.status_line())

    def status_line(self) -> str:
        engine = self.engine.status if self.engine is not None else ""
        return f"serving on port {self.port} with {self.count} frontends: {engine}"

    # The daemon's life.

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        holder, self.port = hold_port(self.config.server.listen)
        lock = instance_lock(self.port)
        host = self.config.server.listen.rpartition(":")[0]
        self._listen = f"{host}:{self.port}"
        openai_holder = None
        if self.config.openai.enabled:
            openai_holder, openai_port = hold_port(self.config.openai.listen)
            self._openai = f"{self.config.openai.listen.rpartition(':')[0]}:{openai_port}"
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        metrics = self._serve_metrics()  # a metrics port that is taken fails the start
        log.info("supervisor.starting", listen=self._listen, frontends=self.count)
        self.engine = self._spawn("engine", 0)
        for index in range(self.count):
            self.frontends[index] = self._spawn("frontend", index)
            self._link(index)
        interval = self._watchdog
        watchdog = asyncio.ensure_future(self._keep_alive(interval)) if interval else None
        try:
            await self._stop.wait()
            await self._drain()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if metrics is not None:
                metrics.shutdown()
                metrics.server_close()
            holder.close()
            if openai_holder is not None:
                openai_holder.close()
            lock.close()
        log.info("supervisor.stopped", exit_code=self.exit_code)
        self.notifier.close()
        return self.exit_code

    def _serve_metrics(self) -> Any:
        """/metrics on [metrics] listen: the children's, added up (procs/metrics.py)."""
        if not self.config.metrics.enabled:
            return None
        from prometheus_client import CollectorRegistry, start_http_server

        from tensord.observability import split_listen
        from tensord.procs.metrics import ChildrenCollector

        def ports() -> list[int]:
            children = [self.engine, *self.frontends.values()]
            return [c.metrics_port for c in children if c is not None and c.metrics_port]

        registry = CollectorRegistry(auto_describe=False)
        registry.register(ChildrenCollector(ports))
        listen = self.config.metrics.listen
        host, port = split_listen(listen)
        try:
            httpd, _thread = start_http_server(port, host, registry=registry)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from None
        log.info("metrics.listening", listen=listen, port=httpd.server_port, path="/metrics")
        return httpd

    def _reload(self) -> None:
        if self.stopping:
            return
        self.notifier.reloading("reloading the configuration and the model repository")
        task = asyncio.ensure_future(self._reloading())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reloading(self) -> None:
        """The supervisor's own settings read again (the drain's are live; a bad file keeps
        the running ones, and the children log why and keep theirs too), then each child
        reloads."""
        self.config, _ = await self.reloader.run(self.config)
        for child in [self.engine, *self.frontends.values()]:
            if child is not None and not self.stopping:
                child.control.send({"op": "reload"})

    async def _drain(self) -> None:
        """Frontends first (their calls finish within the grace), then the engine."""
        self.stopping = True
        grace = self.config.server.drain_grace_seconds
        self.notifier.stopping(f"draining: in-flight calls get {grace:g} s")
        log.info("supervisor.draining", grace_s=grace)
        frontends = list(self.frontends.values())
        for child in frontends:
            child.control.send({"op": "drain"})  # each drains with its own (reloaded) grace
        await self._wait_exit(frontends, grace + _KILL_AFTER_S)
        if self.engine is not None:
            self.engine.control.send({"op": "drain"})
            await self._wait_exit([self.engine], _KILL_AFTER_S)

    async def _wait_exit(self, children: list[Child], within: float) -> None:
        """Until each child has exited (its pidfd says so), killing what is left after
        `within` seconds."""
        deadline = time.monotonic() + within
        for child in children:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await child.gone.wait()
            if child.process.poll() is None:
                log.error("supervisor.killed", role=child.role, index=child.index)
                child.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.process.wait(5)

    async def _keep_alive(self, interval: float) -> None:
        """WATCHDOG=1 each interval while every child has reported within it."""
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            children = [c for c in [self.engine, *self.frontends.values()] if c is not None]
            if all(now - c.alive_at < interval for c in children):
                self.notifier.watchdog()
            else:
                late = [f"{c.role}-{c.index}" for c in children if now - c.alive_at >= interval]
                log.warning("supervisor.watchdog_missed", late=late)
