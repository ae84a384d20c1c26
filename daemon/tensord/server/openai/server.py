"""The API's HTTP server: uvicorn serving the routes as a task of the daemon's own event
loop, on a socket bound before it starts (a taken port fails the start), stopped by the
daemon's drain; uvicorn's own signal handling is left out (the daemon owns the signals).
With [tls] on it serves HTTPS with the gRPC port's certificate (and client CA)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import structlog

from tensord.server.openai.routes import OpenAIRoutes

log = structlog.get_logger("tensord.server")


def _bind(listen: str, reuse_port: bool = False) -> socket.socket:
    """A listening socket on HOST:PORT (IPv6 in brackets); shared with the other frontend
    processes (SO_REUSEPORT) when `reuse_port`."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, int(port)))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot serve the OpenAI API on {listen}: {exc.strerror or exc}") from None
    return sock


class OpenAIServer:
    """start() binds and serves; stop(grace) stops listening, lets requests in progress
    finish within the grace, then cancels the rest."""

    def __init__(
        self,
        routes: OpenAIRoutes,
        listen: str,
        ssl_context: ssl.SSLContext | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.routes = routes
        self.listen = listen
        self.ssl_context = ssl_context
        self.reuse_port = reuse_port
        """HTTPS with it (the gRPC port's [tls] files); None: plain HTTP."""
        self.port = 0
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind and serve; returns the bound port."""
        import uvicorn

        started = asyncio.Event()

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the daemon handles SIGTERM, SIGINT and SIGHUP

            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                if self.started:
                    started.set()

        sock = _bind(self.listen, self.reuse_port)
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.routes.app(),
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
        )
        config.load()
        config.ssl = self.ssl_context  # uvicorn takes files; this one follows reloads
        self._server = Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        waiting = asyncio.ensure_future(started.wait())
        try:  # until it serves, or its task ends (a start that failed)
            await asyncio.wait({self._task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if self._task.done():
            self._task.result()
        log.info(
            "openai.listening",
            listen=self.listen,
            port=self.port,
            scheme="https" if self.ssl_context else "http",
        )
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop listening; requests still running after `grace` seconds are cancelled."""
        if self._server is None or self._task is None:
            return
        self.routes.close_intake()
        self._server.config.timeout_graceful_shutdown = grace
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._server = None
