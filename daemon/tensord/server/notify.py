"""systemd's notification protocol (sd_notify): READY, STATUS, WATCHDOG, RELOADING, STOPPING.

The protocol is one datagram of newline-separated KEY=VALUE lines sent to the unix socket
named by $NOTIFY_SOCKET: a filesystem path, or an abstract-namespace name written with a
leading "@". systemd documents it as a stable interface that a program may speak without
libsystemd, and it is a dozen lines of code, so tensord speaks it directly rather than
depend on a C extension (systemd-python needs libsystemd headers to build) or on an
unmaintained wrapper. Outside systemd ($NOTIFY_SOCKET unset) every call does nothing.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger("tensord.notify")


def socket_address(value: str) -> str | None:
    """The address to send to: a path, or "\\0name" for "@name"; None when unusable."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None  # vsock: and other transports are not spoken here


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, as MONOTONIC_USEC= wants it."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class SystemdNotifier:
    """Sends notifications to the service manager, if there is one."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self._address = socket_address(raw) if raw else None
        self._socket: socket.socket | None = None
        self._warned = False
        if raw and self._address is None:
            log.warning("notify.unsupported_socket", notify_socket=raw)
        if self._address is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            # Never stall the event loop on a full receive queue: drop the message instead.
            sock.setblocking(False)
            self._socket = sock

    @property
    def enabled(self) -> bool:
        """Whether a service manager listens."""
        return self._socket is not None

    def send(self, **fields: object) -> bool:
        """Send KEY=VALUE lines in one datagram; True when it was sent."""
        if self._socket is None or self._address is None:
            return False
        payload = "".join(f"{key}={_one_line(value)}\n" for key, value in fields.items())
        try:
            self._socket.sendto(payload.encode(), self._address)
        except OSError as exc:
            if not self._warned:  # a gone manager must not flood the log
                log.warning("notify.send_failed", error=str(exc), fields=sorted(fields))
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> bool:
        """Start-up or a reload is complete."""
        return self.send(READY=1, STATUS=status)

    def status(self, status: str) -> bool:
        """A free-form line that `systemctl status` shows."""
        return self.send(STATUS=status)

    def reloading(self, status: str) -> bool:
        """A reload begins; MONOTONIC_USEC lets systemd match it to `systemctl reload`."""
        return self.send(RELOADING=1, MONOTONIC_USEC=monotonic_usec(), STATUS=status)

    def stopping(self, status: str) -> bool:
        """The daemon drains and will exit."""
        return self.send(STOPPING=1, STATUS=status)

    def watchdog(self) -> bool:
        """Keep-alive for WatchdogSec=."""
        return self.send(WATCHDOG=1)

    def close(self) -> None:
        """Close the socket; later calls do nothing."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _one_line(value: object) -> str:
    return str(value).replace("\n", " ")


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between keep-alives (half of WatchdogSec), or None when no watchdog is on.

    systemd sets WATCHDOG_USEC, and WATCHDOG_PID to the process it watches: a child that
    inherited the variables is not that process and stays silent.
    """
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    pid = env.get("WATCHDOG_PID", "")
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6
