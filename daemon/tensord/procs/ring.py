"""A single-producer single-consumer ring of messages in shared memory, with a doorbell.

Between a gRPC frontend process and the engine process run two rings, one each way. The
memory is a memfd and the doorbell an eventfd: plain file descriptors, passed to a child
with `pass_fds` (or over a Unix socket with `socket.send_fds`), and nothing is left behind
in /dev/shm when a process is killed.

Layout: a header (magic, version, capacity, then the two counters on cache lines of their
own), then `capacity` bytes of data. `head` is the byte position consumed, written only by
the consumer; `tail` the byte position produced, written only by the producer. Both only
grow; a position modulo the capacity is an offset in the data. A record is an 8-byte
header (uint32 payload length, uint32 flags, zero for now) and the payload, padded to 8
bytes. A record never wraps: one that does not fit before the end of the data is preceded
by a wrap marker (length 0xFFFFFFFF) and starts at offset 0, the bytes skipped counting
as used until the consumer passes them.

The doorbell counts records: the producer stores the record, then `tail`, then adds 1 to
the eventfd; the consumer reads the eventfd (which resets it) and takes exactly that many
records. The kernel updates the count under the eventfd's lock, so what the producer stored
before its write(2) is seen by the consumer after its read(2): that way needs no other
barrier. The other way, the producer reads `head` for the free space (an old value only
makes the ring look fuller); that the consumer has copied a record out before its new
`head` is seen rests on the CPU keeping a store behind the loads before it, which x86-64
does. arm64 allows otherwise in principle, and Python has no fence to order them (the
supervisor runs frontends on x86-64 only).

A second eventfd, the space doorbell, wakes a producer that found the ring full: it sets
the `waiting` word (a line of its own), then clears the space doorbell and tries again;
a consumer that moved `head` on and finds `waiting` set clears it and adds 1 to the space
doorbell. Each side puts a system call on an eventfd (whose lock is a full barrier)
between its store and its load of the other's word, so at least one of them sees the
other's: either the producer's retry finds the space, or the consumer rings.

Linux only (memfd_create, eventfd).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MAGIC = int.from_bytes(b"tsdring\0", "little")
"""The header's first word: the memory given to `Ring.attach` is a tensord ring."""
VERSION = 2
"""The layout's version; a ring of another version is refused by `Ring.attach`."""
MIN_CAPACITY = 64
MAX_CAPACITY = 1 << 32
"""Capacities are powers of two in [MIN_CAPACITY, MAX_CAPACITY]: a payload length fits
the record header's uint32."""

_HEADER_BYTES = 256
"""Magic, version and capacity on the first 64-byte line, `head`, `tail` and `waiting` on
one each, so that the producer's and the consumer's stores do not share a cache line."""
_MAGIC_WORD, _VERSION_WORD, _CAPACITY_WORD, _HEAD_WORD, _TAIL_WORD = 0, 1, 2, 8, 16
_WAITING_WORD = 24
_RECORD_HEADER = struct.Struct("<II")
_WRAP = 0xFFFFFFFF
_POLLIN = select.POLLIN


def _record_bytes(payload_bytes: int) -> int:
    """A record's size in the data: its header and its payload, padded to 8 bytes."""
    return 8 + ((payload_bytes + 7) & ~7)


class Ring:
    """One direction between two processes: one of them calls `try_write`, the other
    `read_available` (and waits on `fileno()`, the doorbell, for something to read).

    `create` makes a ring; `attach` takes one over from the file descriptors `fds()` gave,
    in another process. The object owns its two descriptors: `close()` unmaps the memory
    and closes them. Not thread-safe: each end is used by one thread.
    """

    __slots__ = (
        "_capacity",
        "_closed",
        "_data_view",
        "_event_fd",
        "_map",
        "_memory_fd",
        "_poll",
        "_space_fd",
        "_words",
    )

    def __init__(self, memory_fd: int, event_fd: int, space_fd: int, memory: mmap.mmap) -> None:
        self._memory_fd = memory_fd
        self._event_fd = event_fd
        self._space_fd = space_fd
        self._map = memory
        self._words: npt.NDArray[np.uint64] = np.frombuffer(
            memory, dtype=np.uint64, count=_HEADER_BYTES // 8
        )
        self._capacity: int = self._words.item(_CAPACITY_WORD)
        self._data_view = memoryview(memory)[_HEADER_BYTES : _HEADER_BYTES + self._capacity]
        self._poll: select.poll | None = None
        self._closed = False

    @classmethod
    def create(cls, capacity: int, name: str = "tensord-ring") -> Ring:
        """A new, empty ring of `capacity` data bytes (a power of two, at least 64).
        `name` shows in /proc/<pid>/fd and /proc/<pid>/maps."""
        if capacity < MIN_CAPACITY or capacity > MAX_CAPACITY or capacity & (capacity - 1):
            raise ValueError(
                f"ring capacity {capacity}: must be a power of two from {MIN_CAPACITY} "
                f"to {MAX_CAPACITY} bytes"
            )
        fds: list[int] = []
        try:
            fds.append(os.memfd_create(name, os.MFD_CLOEXEC))
            os.ftruncate(fds[0], _HEADER_BYTES + capacity)
            fds.append(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
            fds.append(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
            memory = mmap.mmap(fds[0], _HEADER_BYTES + capacity)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        memory_fd, event_fd, space_fd = fds
        # The file starts zeroed: head and tail are 0. The magic goes last.
        words = np.frombuffer(memory, dtype=np.uint64, count=_HEADER_BYTES // 8)
        words[_CAPACITY_WORD] = capacity
        words[_VERSION_WORD] = VERSION
        words[_MAGIC_WORD] = MAGIC
        del words
        return cls(memory_fd, event_fd, space_fd, memory)

    @classmethod
    def attach(cls, memory_fd: int, event_fd: int, space_fd: int) -> Ring:
        """The ring whose memory and doorbells are these descriptors (from `fds()`,
        received by this process). The ring owns them from here on, closing them in
        `close()`; on an error they are left open. ValueError if the memory is not a ring
        of this version, with a message saying what was found."""
        size = os.fstat(memory_fd).st_size
        if size < _HEADER_BYTES + MIN_CAPACITY:
            raise ValueError(
                f"fd {memory_fd}: not a tensord ring ({size} bytes, smaller than any ring)"
            )
        memory = mmap.mmap(memory_fd, size)
        try:
            magic, version, capacity = struct.unpack_from("<QQQ", memory, 0)
            if magic != MAGIC:
                raise ValueError(
                    f"fd {memory_fd}: not a tensord ring (magic {magic:#018x}, "
                    f"expected {MAGIC:#018x})"
                )
            if version != VERSION:
                raise ValueError(
                    f"fd {memory_fd}: tensord ring version {version}, this process reads "
                    f"version {VERSION}"
                )
            if size != _HEADER_BYTES + capacity or capacity & (capacity - 1):
                raise ValueError(
                    f"fd {memory_fd}: tensord ring of capacity {capacity} in {size} bytes "
                    f"(expected {_HEADER_BYTES} + capacity)"
                )
        except BaseException:
            memory.close()
            raise
        return cls(memory_fd, event_fd, space_fd, memory)

    @property
    def capacity(self) -> int:
        """Data bytes, record headers, padding and wrap skips included."""
        return self._capacity

    @property
    def max_payload(self) -> int:
        """The largest payload `try_write` takes: its record fills half the data, so it
        fits once the consumer has caught up, wherever the ring's offset is then."""
        return self._capacity // 2 - 8

    def fds(self) -> tuple[int, int, int]:
        """(memory fd, records' eventfd, space eventfd): what `attach` takes in another
        process."""
        return self._memory_fd, self._event_fd, self._space_fd

    def fileno(self) -> int:
        """The doorbell: readable while records are announced and not yet read (for
        `loop.add_reader`, selectors, poll)."""
        return self._event_fd

    def used_bytes(self) -> int:
        """Bytes written and not yet consumed, as far as this process sees now."""
        words = self._words
        used: int = words.item(_TAIL_WORD) - words.item(_HEAD_WORD)
        return used

    def free_bytes(self) -> int:
        """capacity - used_bytes(). A record of n bytes may need more than n free bytes:
        a wrap skips what is left before the end of the data."""
        return self._capacity - self.used_bytes()

    # The producer's end.

    def try_write(self, parts: Sequence[bytes | bytearray | memoryview]) -> bool:
        """Append one record whose payload is `parts` one after the other, and ring the
        doorbell. False, with nothing written, when the ring has no room for it now: call
        `want_space`, try again, and if it is still full wait for `space_fileno()` to be
        readable. ValueError for a payload longer than `max_payload`,
        which would never fit."""
        views: list[memoryview] = []
        length = 0
        for part in parts:
            view = memoryview(part)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")  # a NumPy array's, say: bytes, in the array's order
            views.append(view)
            length += view.nbytes
        if length > self._capacity // 2 - 8:
            raise ValueError(
                f"ring record of {length} payload bytes: at most {self.max_payload} "
                f"fit a ring of {self._capacity} bytes"
            )
        capacity = self._capacity
        words = self._words
        tail: int = words.item(_TAIL_WORD)
        head: int = words.item(_HEAD_WORD)
        free = capacity - (tail - head)
        need = _record_bytes(length)
        offset = tail & (capacity - 1)
        before_end = capacity - offset
        skip = before_end if need > before_end else 0
        if skip + need > free:
            return False
        data = self._data_view
        if skip:
            _RECORD_HEADER.pack_into(data, offset, _WRAP, 0)
            offset = 0
        _RECORD_HEADER.pack_into(data, offset, length, 0)
        at = offset + 8
        for view in views:
            end = at + view.nbytes
            data[at:end] = view
            at = end
        words[_TAIL_WORD] = tail + skip + need
        os.eventfd_write(self._event_fd, 1)
        return True

    def space_fileno(self) -> int:
        """The space doorbell: readable once the consumer has freed space after
        `want_space` (for `loop.add_reader`)."""
        return self._space_fd

    def want_space(self) -> None:
        """Ask the consumer to ring the space doorbell when it next frees space; then try
        the write again before waiting for `space_fileno()` (the module says why that
        order cannot miss a wake-up)."""
        self._words[_WAITING_WORD] = 1
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._space_fd)  # a space ring from before (and the barrier)

    # The consumer's end.

    def read_available(self, max_records: int | None = None) -> list[bytes]:
        """The payloads of the records announced so far, oldest first (copied out), at
        most `max_records` of them; empty if none. The space they took is free when this
        returns. Records announced and left unread (over `max_records`) are announced
        again, so `fileno()` stays readable for them."""
        if max_records is not None and max_records < 0:
            raise ValueError(f"max_records {max_records}: must be 0 or more")
        try:
            announced = os.eventfd_read(self._event_fd)
        except BlockingIOError:
            return []
        count = announced if max_records is None else min(announced, max_records)
        if count < announced:
            os.eventfd_write(self._event_fd, announced - count)
        capacity = self._capacity
        mask = capacity - 1
        words = self._words
        data = self._data_view
        head: int = words.item(_HEAD_WORD)
        payloads: list[bytes] = []
        while len(payloads) < count:
            offset = head & mask
            length, _flags = _RECORD_HEADER.unpack_from(data, offset)
            if length == _WRAP:
                head += capacity - offset
                continue
            if length > capacity // 2 - 8:
                raise RuntimeError(
                    f"ring corrupted: a record of {length} bytes at offset {offset} "
                    f"of a ring of {capacity} bytes"
                )
            payloads.append(data[offset + 8 : offset + 8 + length].tobytes())
            head += _record_bytes(length)
        words[_HEAD_WORD] = head
        if payloads:
            os.eventfd_write(self._space_fd, 0)  # wakes nobody: the barrier before the load
            if words.item(_WAITING_WORD):
                words[_WAITING_WORD] = 0
                os.eventfd_write(self._space_fd, 1)
        return payloads

    def wait(self, timeout: float | None = None) -> bool:
        """Block until records are announced: True, or False after `timeout` seconds
        (None: no limit). For a consumer without an event loop."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self._event_fd, _POLLIN)
        milliseconds = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        return bool(self._poll.poll(milliseconds))

    def close(self) -> None:
        """Unmap the memory and close its three descriptors; again is a no-op. The memory
        lives on while the other process keeps its mapping."""
        if self._closed:
            return
        self._closed = True
        self._data_view.release()
        self._words = np.empty(0, dtype=np.uint64)  # the view's export must go before close
        self._map.close()
        os.close(self._memory_fd)
        os.close(self._event_fd)
        os.close(self._space_fd)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
