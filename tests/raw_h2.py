"""gRPC calls as raw HTTP/2 frames (the `h2` package), for what a gRPC client never sends:
a call that ends without its message, a message shorter than its length prefix, a call
that never sends its message, or arbitrary frames."""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions


@dataclass
class RawReply:
    """What the server answered on one stream."""

    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    ended: bool = False
    reset: int | None = None
    """The error code of a RST_STREAM the server sent, if any."""

    @property
    def status(self) -> int | None:
        """grpc-status (in the trailers, or in the headers of a trailers-only reply)."""
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        from urllib.parse import unquote

        return unquote(self.trailers.get("grpc-message", self.headers.get("grpc-message", "")))


_GOAWAY = 0x7


def frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message (not compressed)."""
    return b"\0" + struct.pack(">I", len(message)) + message


class RawConnection:
    """One HTTP/2 connection to a gRPC server over plaintext TCP (prior knowledge)."""

    def __init__(self, target: str, timeout: float = 10.0) -> None:
        host, port = target.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        self.authority = target
        self.replies: dict[int, RawReply] = {}
        self.goaway = False
        """Whether the server sent GOAWAY (it is draining)."""
        self._buffer = b""
        self._flush()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def start(
        self, method: str, end_stream: bool = False, extra: tuple[tuple[str, str], ...] = ()
    ) -> int:
        """Send a call's headers (and `extra` ones); returns its stream id."""
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", method),
                (":authority", self.authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *extra,
            ],
            end_stream=end_stream,
        )
        self.replies[stream] = RawReply()
        self._flush()
        return stream

    def send(self, stream: int, data: bytes, end_stream: bool = False) -> None:
        """DATA on the stream (split to fit the peer's frame size and window)."""
        size = self.conn.max_outbound_frame_size
        for start in range(0, max(len(data), 1), size):
            chunk = data[start : start + size]
            last = start + size >= len(data)
            while self.conn.local_flow_control_window(stream) < len(chunk):
                self.pump(0.5)
            self.conn.send_data(stream, chunk, end_stream=end_stream and last)
            self._flush()

    def pump(self, timeout: float) -> None:
        """Read what arrives within `timeout` seconds and record it per stream."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except (TimeoutError, BlockingIOError):
            return
        if not data:
            self._closed()
            return
        self._buffer += data
        frames = bytearray()
        while len(self._buffer) >= 9:
            size = 9 + int.from_bytes(self._buffer[:3], "big")
            if len(self._buffer) < size:
                break
            raw, self._buffer = self._buffer[:size], self._buffer[size:]
            if raw[3] == _GOAWAY:
                # h2 takes the connection for closed at a GOAWAY and refuses the frames that
                # follow, but the streams it lets finish (a drain) still get their replies.
                self.goaway = True
                continue
            frames += raw
        try:
            events = self.conn.receive_data(bytes(frames))
        except h2.exceptions.ProtocolError:  # frames after the connection closed
            self._closed()
            return
        for event in events:
            self._record(event)
        self._flush()

    def _closed(self) -> None:
        """The server closed the connection: every stream has ended as it is."""
        for reply in self.replies.values():
            reply.ended = True

    def _record(self, event: h2.events.Event) -> None:
        stream = getattr(event, "stream_id", 0)
        reply = self.replies.get(stream)
        if isinstance(event, h2.events.DataReceived):
            self.conn.acknowledge_received_data(event.flow_controlled_length, stream)
            if reply is not None:
                reply.data += event.data
        if reply is None:
            return
        if isinstance(event, h2.events.ResponseReceived):
            reply.headers = dict(event.headers)
        elif isinstance(event, h2.events.TrailersReceived):
            reply.trailers = dict(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            reply.ended = True
        elif isinstance(event, h2.events.StreamReset):
            reply.reset, reply.ended = int(event.error_code), True

    def wait(self, stream: int, timeout: float = 10.0) -> RawReply:
        """The stream's reply once it has ended (or as it is when `timeout` passes)."""
        deadline = time.monotonic() + timeout
        while not self.replies[stream].ended and time.monotonic() < deadline:
            self.pump(min(0.2, max(0.01, deadline - time.monotonic())))
        return self.replies[stream]

    def close(self) -> None:
        try:
            self.conn.close_connection()
            self._flush()
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
