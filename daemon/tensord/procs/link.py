"""One frontend's link with the engine on an event loop: a ring each way, messages in and out.

Received messages are handed to a callback as the doorbell rings, a bounded batch per
wake-up so that one busy link cannot hold the loop. Messages posted in one pass of the
event loop leave as one record (`post`): under load one doorbell, one wake-up of the other
process, serves many calls. A message the outgoing ring has no room
for waits in a backlog, written in order when the other end rings the ring's space
doorbell (`send`), or is refused at once (`try_send`: a frontend answers a new request
RESOURCE_EXHAUSTED rather than queue without bound).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

import msgspec
import structlog

from tensord.procs.messages import Batch, Message, Single, decode, encode
from tensord.procs.ring import Ring

log = structlog.get_logger("tensord.procs")

_BATCH = 256
"""Messages taken per wake-up before the loop runs other work."""


class LinkClosed(ConnectionError):
    """The link was closed: the other process ended or is being replaced."""


class Link:
    """Messages over `outgoing` and from `incoming` (both owned: `close` closes them)."""

    def __init__(
        self,
        outgoing: Ring,
        incoming: Ring,
        on_message: Callable[[Message], None],
        on_unsendable: Callable[[Single, Exception], None] = lambda message, exc: None,
    ) -> None:
        """`on_unsendable` hears of a posted message that could not be written (too large
        for a record, or not encodable), so that whoever waits for its answer hears too."""
        self.outgoing = outgoing
        self.incoming = incoming
        self.on_message = on_message
        self.on_unsendable = on_unsendable
        self._backlog: collections.deque[list[bytes | memoryview]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting = False
        """Whether the loop watches the outgoing ring's space doorbell."""
        self._pending: list[tuple[Single, int]] = []
        self.pending_bytes = 0
        """Tensor bytes of the messages posted and not yet written."""
        self._flush_handle: asyncio.Handle | None = None
        self.closed = False

    def open(self) -> None:
        """Start taking messages on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.incoming.fileno(), self._readable)
        self._readable()  # anything announced before the reader was added

    def _readable(self) -> None:
        if self.closed:
            return
        for record in self.incoming.read_available(_BATCH):
            try:
                message = decode(record)
            except msgspec.DecodeError as exc:  # a defect, not load: say so, go on
                log.error("link.bad_record", error=str(exc), size=len(record))
                continue
            self.on_message(message)
            if self.closed:
                return

    def try_send(self, message: Message) -> bool:
        """Write `message` now; False when the ring is full (or a backlog waits). A
        message too large for the ring raises ValueError."""
        if self.closed:
            raise LinkClosed("the link to the other process is closed")
        if self._backlog:
            return False
        return self.outgoing.try_write(encode(message))

    def send(self, message: Message) -> None:
        """Write `message`, after any backlog, as soon as the ring has room."""
        if self.closed:
            raise LinkClosed("the link to the other process is closed")
        parts = encode(message)
        if self._backlog or not self.outgoing.try_write(parts):
            self._backlog.append(parts)
            self._schedule()

    def post(self, message: Single, size: int = 0) -> None:
        """Send `message` with the others posted in this pass of the event loop, as one
        record (one doorbell for all); `size` is its tensors' bytes, for `pending_bytes`."""
        if self.closed:
            raise LinkClosed("the link to the other process is closed")
        self._pending.append((message, size))
        self.pending_bytes += size
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._send_pending)

    def _send_pending(self) -> None:
        """The posted messages as few records as fit: a record holds at most half the
        ring, so large tensors go in groups."""
        self._flush_handle = None
        pending, self._pending = self._pending, []
        self.pending_bytes = 0
        limit = self.outgoing.max_payload // 2
        group: list[Single] = []
        size = 0
        for message, nbytes in pending:
            if group and size + nbytes > limit:
                self._send_group(group)
                group, size = [], 0
            group.append(message)
            size += nbytes
        self._send_group(group)

    def _send_group(self, group: list[Single]) -> None:
        if not group or self.closed:
            return
        try:
            self.send(group[0] if len(group) == 1 else Batch(group))
        except (LinkClosed, MemoryError):
            raise
        except Exception as exc:  # larger than a record may be, or not encodable
            if len(group) > 1:  # one at a time: only the one at fault is lost
                for message in group:
                    self._send_group([message])
                return
            log.error("link.unsendable", kind=type(group[0]).__name__, error=repr(exc)[:300])
            self.on_unsendable(group[0], exc)

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def _schedule(self) -> None:
        """Wait for the space doorbell (asked for first, then the backlog tried again)."""
        if self._loop is None or self.closed:
            return
        self.outgoing.want_space()
        if self._write_backlog():
            return
        if not self._waiting:
            self._loop.add_reader(self.outgoing.space_fileno(), self._flush)
            self._waiting = True

    def _flush(self) -> None:
        """The space doorbell rang: write what the backlog holds, then wait again or stop
        watching."""
        if self.closed:
            return
        if not self._write_backlog():
            self.outgoing.want_space()  # clears the ring that woke us, asks for the next
            if not self._write_backlog():
                return
        self._stop_waiting()

    def _write_backlog(self) -> bool:
        """Write the backlog in order while it fits; True once it is empty."""
        while self._backlog:
            if not self.outgoing.try_write(self._backlog[0]):
                return False
            self._backlog.popleft()
        return True

    def _stop_waiting(self) -> None:
        if self._waiting and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.outgoing.space_fileno())
        self._waiting = False

    def close(self) -> None:
        """Stop reading, drop the backlog, close both rings (again: nothing)."""
        if self.closed:
            return
        self.closed = True
        self._stop_waiting()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._pending.clear()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.incoming.fileno())
        self._backlog.clear()
        self.outgoing.close()
        self.incoming.close()
