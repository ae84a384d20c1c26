"""The systemd watchdog: WATCHDOG=1 at half of WatchdogSec, only while serving really works.

A keep-alive sent from a timer would prove only that a timer fires. Before each one the
watchdog makes a real `tensord.v1.InferenceService/Health` call to the daemon's own gRPC
server and waits for its answer, so a keep-alive proves that the event loop runs, that
grpc's server core accepts and dispatches calls, and that the servicer answers. If any of
them hangs, the keep-alives stop and systemd restarts the daemon (WatchdogSec=).

The call goes over a private unix socket rather than the public port: the public port may
listen on any address and may demand TLS client certificates or tokens, which the probe
should not depend on. The socket lives in a fresh directory of mode 0700 (under
$RUNTIME_DIRECTORY when systemd provides one, else the temporary directory), named after
the daemon's pid, so only the daemon's own user can connect, and it exists only while a
watchdog is configured. A daemon killed outright (SIGKILL) cannot remove it: the next one
to start there removes the directories of daemons that are gone. An answer with any status except
UNAVAILABLE or DEADLINE_EXCEEDED counts.

The probe carries a per-process secret in its metadata (PROBE_KEY): authentication lets it
through without a token, and metrics and logs leave it out, so that the daemon's own
probes are neither failed logins nor client calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import structlog

from tensord.server.notify import SystemdNotifier
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc

log = structlog.get_logger("tensord.watchdog")

_NO_ANSWER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
PROBE_KEY = "x-tensord-watchdog"
PROBED_METHOD = "/tensord.v1.InferenceService/Health"
"""The method the watchdog calls (auth leaves it open; the interceptors let its probe by)."""
_PROBE_SECRET = secrets.token_urlsafe(24)
_PROBE_METADATA = ((PROBE_KEY, _PROBE_SECRET),)


def is_probe(metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
    """True for the watchdog's own Health call (its metadata holds this process's secret)."""
    return any(
        key == PROBE_KEY and secrets.compare_digest(str(value), _PROBE_SECRET)
        for key, value in metadata or ()
    )


_PROBE_TIMEOUT_CAP_S = 10.0


_PREFIX = "tensord-watchdog-"
_LONGEST_PARENT = 60
"""Beyond it the socket's path (parent/tensord-watchdog-PID-XXXXXXXX/probe.sock) could pass
the 107 bytes a unix socket's path may take: /tmp is used instead."""


def _probe_directory() -> Path:
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or None
    if runtime is not None and not Path(runtime).is_dir():
        runtime = None
    parent = Path(runtime or tempfile.gettempdir())
    if len(str(parent)) > _LONGEST_PARENT:  # a unix socket's path holds 107 bytes at most
        parent = Path("/tmp")
    _remove_stale(parent)
    return Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=parent))


def _remove_stale(parent: Path) -> None:
    """Remove this user's probe directories under `parent` whose daemon is gone."""
    for path in parent.glob(f"{_PREFIX}*"):
        pid = path.name.removeprefix(_PREFIX).split("-", 1)[0]
        try:
            info = path.lstat()
        except OSError:
            continue
        mine = info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode)
        if mine and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            log.info("watchdog.stale_probe_removed", path=str(path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has that pid now
        return True
    return True


class Watchdog:
    """Probes the server every `interval` seconds and sends WATCHDOG=1 after each answer."""

    def __init__(self, notifier: SystemdNotifier, interval: float) -> None:
        self.notifier = notifier
        self.interval = interval
        self.probe_timeout = min(interval / 2, _PROBE_TIMEOUT_CAP_S)
        self._directory = _probe_directory()
        self.address = f"unix:{self._directory / 'probe.sock'}"
        """The listening address the server adds for the probe."""
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.missed = 0

    def start(self) -> None:
        """Begin probing on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="watchdog")
            log.info("watchdog.started", interval_s=self.interval, probe=self.address)

    async def stop(self) -> None:
        """Stop probing (at drain: systemd stops watching once STOPPING=1 is sent)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def close(self) -> None:
        """Remove the probe socket's directory."""
        shutil.rmtree(self._directory, ignore_errors=True)

    async def _run(self) -> None:
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            while True:
                started = time.monotonic()
                if await self.probe(stub):
                    self.notifier.watchdog()
                    self.sent += 1
                else:
                    self.missed += 1
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def probe(self, stub: pb_grpc.InferenceServiceStub) -> bool:
        """One Health call; True when the server answered in time."""
        try:
            await stub.Health(
                pb.HealthRequest(), timeout=self.probe_timeout, metadata=_PROBE_METADATA
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _NO_ANSWER:
                log.warning(
                    "watchdog.no_answer",
                    status=exc.code().name,
                    error=exc.details(),
                    timeout_s=self.probe_timeout,
                )
                return False
        return True
