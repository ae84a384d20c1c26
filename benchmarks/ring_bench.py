"""Round trips between two processes over tensord.procs.ring: a ping over one ring, the pong
over another, one in flight, each side blocked in poll(2) on its doorbell (or, with
--spin, reading the doorbell in a loop: the ring's own cost, without sleeps and wake-ups).

    python benchmarks/ring_bench.py [--seconds 2] [--spin]

Prints, per payload size, the microseconds per round trip and the CPU microseconds each
process spent per round trip (time.process_time: user and system, waiting excluded).
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import time

from tensord.procs.ring import Ring

_REPORT = b""  # the pong answers with its process_time
_QUIT = b"q"
_SIZES = (64, 64 * 1024)


def pong(fds: list[int], spin: bool) -> None:
    """The echoing side: every payload goes back as it came."""
    ping, back = Ring.attach(*fds[:3]), Ring.attach(*fds[3:6])
    while True:
        if not spin:
            ping.wait()
        for payload in ping.read_available():
            if payload == _QUIT:
                return
            if payload == _REPORT:
                payload = struct.pack("<d", time.process_time())
            while not back.try_write([payload]):
                time.sleep(0.0001)


def _round_trip(ping: Ring, back: Ring, payload: bytes, spin: bool) -> bytes:
    while not ping.try_write([payload]):
        time.sleep(0.0001)
    while True:
        if not spin:
            back.wait()
        answers = back.read_available()
        if answers:
            return answers[0]


def _measure(
    ping: Ring, back: Ring, size: int, seconds: float, spin: bool
) -> tuple[float, float, float]:
    """µs per round trip, and CPU µs per round trip in this process and in the pong."""
    payload = os.urandom(size)
    warm_until = time.perf_counter() + min(0.2, seconds / 5)
    while time.perf_counter() < warm_until:
        _round_trip(ping, back, payload, spin)
    (pong_cpu0,) = struct.unpack("<d", _round_trip(ping, back, _REPORT, spin))
    cpu0, start = time.process_time(), time.perf_counter()
    count = 0
    end = start + seconds
    while True:
        for _ in range(100):
            assert _round_trip(ping, back, payload, spin) == payload
        count += 100
        if time.perf_counter() >= end:
            break
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    (pong_cpu1,) = struct.unpack("<d", _round_trip(ping, back, _REPORT, spin))
    return (1e6 * elapsed / count, 1e6 * cpu / count, 1e6 * (pong_cpu1 - pong_cpu0) / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per payload size")
    parser.add_argument("--spin", action="store_true", help="no poll(2): read in a loop")
    parser.add_argument("--pong", nargs=6, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pong:
        pong(args.pong, args.spin)
        return
    with Ring.create(1 << 20, "bench-ping") as ping, Ring.create(1 << 20, "bench-pong") as back:
        fds = [*ping.fds(), *back.fds()]
        child = subprocess.Popen(
            [sys.executable, __file__, "--pong", *map(str, fds)] + ["--spin"] * args.spin,
            pass_fds=fds,
        )
        try:
            print(f"{'payload':>9} {'µs/round trip':>14} {'CPU µs ping':>12} {'CPU µs pong':>12}")
            for size in _SIZES:
                trip, ping_cpu, pong_cpu = _measure(ping, back, size, args.seconds, args.spin)
                print(f"{size:>9} {trip:>14.1f} {ping_cpu:>12.1f} {pong_cpu:>12.1f}")
            print("CPU µs are per round trip: one message sent and one received by each side.")
            ping.try_write([_QUIT])
            child.wait(10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


if __name__ == "__main__":
    main()
