"""tensord.procs.ring: records in order and intact, wrap-around, a full ring, the header
checks, and a child process echoing 10,000 records through two rings."""

from __future__ import annotations

import os
import random
import select
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tensord
from tensord.procs.ring import MAGIC, Ring


@pytest.fixture
def ring() -> Iterator[Ring]:
    with Ring.create(1024) as made:
        yield made


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_records_come_out_in_order_with_their_bytes(ring: Ring) -> None:
    payloads = [bytes(range(n % 256)) * (1 + n // 256) for n in (0, 1, 7, 8, 9, 63, 300, 504)]
    for payload in payloads:
        assert ring.try_write([payload])
    assert _readable(ring.fileno())
    assert ring.read_available() == payloads
    assert not _readable(ring.fileno())
    assert ring.read_available() == []
    assert ring.used_bytes() == 0
    assert ring.free_bytes() == ring.capacity == 1024


def test_parts_are_joined_into_one_payload(ring: Ring) -> None:
    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    parts = [b"ab", bytearray(b"cd"), memoryview(b"xefx")[1:3], memoryview(floats), b""]
    assert ring.try_write(parts)
    assert ring.read_available() == [b"abcdef" + floats.tobytes()]


def test_wraps_around_many_times_with_random_sizes() -> None:
    generator = random.Random(1234)
    expected: deque[bytes] = deque()
    written = 0
    with Ring.create(1024) as ring:
        for _ in range(5000):
            if generator.random() < 0.55:
                size = generator.randint(0, ring.max_payload)
                payload = generator.randbytes(size)
                if ring.try_write([payload[: size // 3], payload[size // 3 :]]):
                    expected.append(payload)
                    written += 8 + size
            else:
                limit = generator.choice([None, 1, 2])
                for payload in ring.read_available(limit):
                    assert payload == expected.popleft()
        for payload in ring.read_available():
            assert payload == expected.popleft()
        assert not expected
        assert ring.used_bytes() == 0
    assert written > 50 * 1024  # the ring went round many times


def test_records_left_by_max_records_keep_the_doorbell_ringing(ring: Ring) -> None:
    for n in range(5):
        assert ring.try_write([bytes([n])])
    assert ring.read_available(max_records=2) == [b"\x00", b"\x01"]
    assert _readable(ring.fileno())
    assert ring.read_available(max_records=0) == []
    assert ring.read_available() == [b"\x02", b"\x03", b"\x04"]
    assert not _readable(ring.fileno())
    with pytest.raises(ValueError, match="max_records -1: must be 0 or more"):
        ring.read_available(max_records=-1)


def test_a_full_ring_refuses_then_takes_the_record_once_read() -> None:
    with Ring.create(256) as ring:
        record = bytes(100)  # 112 bytes with its header and padding
        assert ring.try_write([record])
        assert ring.try_write([record])
        assert ring.used_bytes() == 224
        assert not ring.try_write([record])
        assert not ring.try_write([bytes(ring.max_payload)])
        assert ring.used_bytes() == 224
        assert ring.read_available() == [record, record]
        # 32 bytes are left before the end: the record goes to offset 0, the 32 are skipped.
        assert ring.try_write([b"\x01" * 100])
        assert ring.used_bytes() == 32 + 112
        assert ring.free_bytes() == 256 - 144
        assert ring.read_available() == [b"\x01" * 100]
        assert ring.used_bytes() == 0


def test_a_record_that_could_never_fit_raises(ring: Ring) -> None:
    assert ring.max_payload == 504
    assert ring.try_write([bytes(504)])
    with pytest.raises(ValueError, match=r"505 payload bytes: at most 504 fit a ring of 1024"):
        ring.try_write([bytes(500), bytes(5)])
    assert ring.read_available() == [bytes(504)]


@pytest.mark.parametrize("capacity", [0, 32, 1000, 1 << 33])
def test_capacity_is_a_power_of_two_in_range(capacity: int) -> None:
    with pytest.raises(ValueError, match=f"ring capacity {capacity}: must be a power of two"):
        Ring.create(capacity)


def _memfd_with(words: list[int], size: int) -> int:
    fd = os.memfd_create("not-a-ring", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    os.pwrite(fd, np.array(words, dtype=np.uint64).tobytes(), 0)
    return fd


@pytest.mark.parametrize(
    ("words", "size", "message"),
    [
        ([0x1234, 2, 1024], 256 + 1024, "not a tensord ring \\(magic 0x0000000000001234"),
        ([MAGIC, 1, 1024], 256 + 1024, "tensord ring version 1, this process reads version 2"),
        ([MAGIC, 2, 1024], 256 + 2048, "tensord ring of capacity 1024 in 2304 bytes"),
        ([MAGIC, 1, 1024], 100, "not a tensord ring \\(100 bytes"),
    ],
)
def test_attach_refuses_what_is_not_a_ring(words: list[int], size: int, message: str) -> None:
    memory_fd = _memfd_with(words, size)
    event_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    space_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        with pytest.raises(ValueError, match=message):
            Ring.attach(memory_fd, event_fd, space_fd)
    finally:
        os.close(memory_fd)
        os.close(event_fd)
        os.close(space_fd)


def test_attach_sees_the_same_ring(ring: Ring) -> None:
    with Ring.attach(*(os.dup(fd) for fd in ring.fds())) as other:
        assert other.capacity == 1024
        assert ring.try_write([b"there"])
        assert other.wait(0)
        assert other.read_available() == [b"there"]
        assert ring.used_bytes() == 0
        assert not ring.wait(0.001)


def test_a_full_ring_rings_the_space_doorbell_once_read(ring: Ring) -> None:
    """A producer that found the ring full asks for space; the consumer's read rings the
    space doorbell once (and not for a producer that did not ask)."""
    space = select.poll()
    space.register(ring.space_fileno(), select.POLLIN)
    assert ring.try_write([bytes(504)]) and ring.try_write([bytes(504)])
    assert not ring.try_write([bytes(504)])  # full
    ring.want_space()
    assert not ring.try_write([bytes(504)])  # still full: wait for the doorbell
    assert not space.poll(0)
    assert ring.read_available(1) == [bytes(504)]
    assert space.poll(0)  # rung
    ring.want_space()  # clears it before trying again
    assert not space.poll(0)
    assert ring.try_write([bytes(504)])
    assert len(ring.read_available()) == 2
    assert space.poll(0)  # the flag was still up: a spare ring, harmless
    ring.want_space()
    assert ring.try_write([b"x"])
    ring.read_available()
    os.eventfd_read(ring.space_fileno())
    assert ring.try_write([b"y"])  # nobody asked since: no ring
    ring.read_available()
    assert not space.poll(0)


def test_close_closes_its_fds_once() -> None:
    ring = Ring.create(1024)
    fds = ring.fds()
    ring.close()
    ring.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


_ECHO = """
import sys
import time
from tensord.procs.ring import Ring
ping = Ring.attach(*map(int, sys.argv[1:4]))
pong = Ring.attach(*map(int, sys.argv[4:7]))
left = int(sys.argv[7])
while left:
    if not ping.wait(10):
        sys.exit("nothing came for 10 s")
    for payload in ping.read_available():
        while not pong.try_write([payload]):
            time.sleep(0.0005)  # until the parent has read some
        left -= 1
"""


def test_a_child_process_echoes_every_record() -> None:
    generator = random.Random(99)
    count = 10_000
    payloads = [generator.randbytes(generator.choice([0, 1, 64, 200, 1500])) for _ in range(count)]
    assert sum(map(len, payloads)) > 10 * 16384
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(tensord.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    with Ring.create(16384, "test-ping") as ping, Ring.create(16384, "test-pong") as pong:
        fds = [*ping.fds(), *pong.fds()]
        child = subprocess.Popen(
            [sys.executable, "-c", _ECHO, *map(str, fds), str(count)], pass_fds=fds, env=env
        )
        try:
            echoed: list[bytes] = []
            deadline = time.monotonic() + 20
            for payload in payloads:
                while not ping.try_write([payload]):
                    pong.wait(0.01)
                    echoed += pong.read_available()
                    assert time.monotonic() < deadline
            while len(echoed) < count:
                assert pong.wait(max(0.0, deadline - time.monotonic())), f"{len(echoed)} back"
                echoed += pong.read_available()
            assert child.wait(10) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert len(echoed) == count
    for n, (sent, back) in enumerate(zip(payloads, echoed, strict=True)):
        assert back == sent, f"record {n}"
