"""A stand-in for systemd's side of the notify protocol: a real unix datagram socket that
collects what the daemon sends to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path


class NotifyListener:
    """Binds a datagram socket (a path, or an abstract name) and parses each message."""

    def __init__(self, abstract: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # A short directory of its own: socket paths are limited to 107 bytes.
        self._directory = Path(tempfile.mkdtemp(prefix="tensord-notify-"))
        if abstract:
            name = f"tensord-test-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            path = self._directory / "notify.sock"
            self.sock.bind(str(path))
            self.address = str(path)
        self.messages: list[dict[str, str]] = []

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ plus NOTIFY_SOCKET (and `extra`), for a daemon subprocess."""
        return {**os.environ, "NOTIFY_SOCKET": self.address, **extra}

    def receive(self, timeout: float) -> dict[str, str] | None:
        """The next message, or None when none arrives within `timeout` seconds."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return None
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
        self.messages.append(fields)
        return fields

    def wait_for(self, key: str, timeout: float = 60) -> dict[str, str]:
        """Receive until a message carries `key`; returns that message."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.receive(left)
            if message is not None and key in message:
                return message
        raise AssertionError(f"no {key}= within {timeout}s; got {self.messages}")

    def drain(self, seconds: float) -> list[dict[str, str]]:
        """Everything that arrives within `seconds`."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            message = self.receive(left)
            if message is not None:
                got.append(message)
        return got

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self._directory, ignore_errors=True)
