"""The control channel between the supervisor and one child: small JSON messages, with file
descriptors beside them (a link's rings), over a Unix SOCK_SEQPACKET socket pair.

Supervisor to child: {"op": "link", "index": i} with a link's four fds; {"op":
"engine_down"}; {"op": "reload"}; {"op": "drain", "grace": seconds}.
Child to supervisor: {"op": "ready", "status": line}; {"op": "alive"}; {"op": "status",
"status": line}.
A child whose channel closes (the supervisor died) drains and exits.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

_MAX_MESSAGE = 64 * 1024
_MAX_FDS = 8

Handler = Callable[[dict[str, Any], list[int]], None]


def pair() -> tuple[socket.socket, socket.socket]:
    """(the supervisor's end, the child's end); the child's is inheritable."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    return ours, theirs


class Control:
    """One end of a control channel on the running event loop."""

    def __init__(self, sock: socket.socket, on_message: Handler, on_closed: Callable[[], None]):
        self.sock = sock
        self.on_message = on_message
        self.on_closed = on_closed
        self.closed = False
        sock.setblocking(False)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        """Send `message` (and `fds`, duplicated into the other process); a closed
        channel drops it (its process is gone, and its exit is handled)."""
        if self.closed:
            return
        data = json.dumps(message).encode()
        try:
            if fds:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            # A full socket buffer: control messages are few and small; wait for room.
            self.sock.setblocking(True)
            try:
                socket.send_fds(self.sock, [data], fds or [])
            finally:
                self.sock.setblocking(False)
        except OSError:
            self._close()

    def _readable(self) -> None:
        while not self.closed:
            try:
                data, fds, _flags, _address = socket.recv_fds(self.sock, _MAX_MESSAGE, _MAX_FDS)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self._close()
                return
            self.on_message(json.loads(data), list(fds))

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.on_closed()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
            self.sock.close()
