"""Health probed from a third process while a test's work runs, held to a bound over an
idle baseline taken by the same probe.

As a script it calls InferenceService/Health every 10 ms and prints each call's start time
(time.monotonic, one clock for every process on the host), latency in milliseconds and
status, one line per call, until it reads a line on stdin or `seconds` pass:

    python -P tests/health_probe.py HOST:PORT SECONDS   (-P: tests/grpc is not grpc)

From a test, `HealthProbe` runs it: its first calls, made before the test starts its work,
are the idle baseline, and `ProbeRecord.assert_answered` bounds the calls that overlapped
the work. A probe in the test's own process would share the GIL with an in-process server
and measure the test's threads as much as the daemon. The stalls these tests guard against
last whole seconds, while scheduling alone on a shared 2-core host has delayed single calls
by up to ~200 ms (and beside a thread holding the GIL, ~550 ms): a bound sits between the
two, never at the idle latency.
"""

from __future__ import annotations

import math
import select
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc

from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc

IDLE_CALLS = 20
"""Calls the probe makes before `HealthProbe` returns: the idle baseline."""
IDLE_FACTOR = 10
"""A bound is `within_s` plus this many idle medians (~1 ms idle, tens on a loaded host)."""


@dataclass(frozen=True, slots=True)
class ProbeCall:
    """One Health call of the probe."""

    start: float
    """time.monotonic() when it was sent."""
    seconds: float
    """How long its answer took."""
    status: str
    """"OK", or the name of the gRPC code it ended with."""

    @property
    def end(self) -> float:
        return self.start + self.seconds

    @classmethod
    def parse(cls, line: str) -> ProbeCall:
        start, ms, status = line.split()
        return cls(float(start), float(ms) / 1e3, status)


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """What the probe saw: its idle baseline, then every later call."""

    idle: list[ProbeCall]
    calls: list[ProbeCall]

    @property
    def idle_median(self) -> float:
        return statistics.median(c.seconds for c in self.idle)

    def during(self, since: float = -math.inf, until: float = math.inf) -> list[ProbeCall]:
        """The calls that were in flight at some moment of [since, until]."""
        return [c for c in self.calls if c.end >= since and c.start <= until]

    def assert_answered(
        self, since: float = -math.inf, until: float = math.inf, *, within_s: float, what: str
    ) -> list[ProbeCall]:
        """Every call in flight during [since, until] (by default, every call after the
        idle ones) was answered OK, none slower than `within_s` plus IDLE_FACTOR idle
        medians; returns those calls."""
        during = self.during(since, until)
        assert during, f"{what}: no Health call was in flight then"
        failed = [c for c in self.idle + during if c.status != "OK"]
        assert not failed, f"{what}: Health failed: {failed[:5]}"
        idle_ms = [c.seconds * 1e3 for c in self.idle]
        limit = within_s + IDLE_FACTOR * self.idle_median
        at = max(range(len(during)), key=lambda i: during[i].seconds)
        around = [round(c.seconds * 1e3, 1) for c in during[max(at - 3, 0) : at + 4]]
        assert during[at].seconds < limit, (
            f"{what}: one Health call took {during[at].seconds * 1e3:.0f} ms, over "
            f"{limit * 1e3:.0f} ms ({within_s * 1e3:.0f} ms + {IDLE_FACTOR} x the idle median "
            f"{statistics.median(idle_ms):.1f} ms; idle max {max(idle_ms):.1f} ms); the calls "
            f"around it (ms): {around}, {len(during)} calls in all"
        )
        return during


class HealthProbe:
    """This file run as a third process against `target`, as a context manager: entered
    once it has made IDLE_CALLS calls, stopped by `stop()` or on exit."""

    def __init__(self, target: str, seconds: float = 120.0) -> None:
        self.target = target
        self.seconds = seconds
        self.idle: list[ProbeCall] = []
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> HealthProbe:
        self._process = subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__)), self.target, str(self.seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        assert self._process.stdout.readline().strip() == "READY", "the probe did not connect"
        self.idle = [ProbeCall.parse(self._process.stdout.readline()) for _ in range(IDLE_CALLS)]
        return self

    def stop(self) -> ProbeRecord:
        """End the probe and return what it saw."""
        assert self._process is not None, "the probe was not started"
        out, _ = self._process.communicate("stop\n", timeout=30)
        return ProbeRecord(self.idle, [ProbeCall.parse(line) for line in out.splitlines()])

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)


def main() -> int:
    target, seconds = sys.argv[1], float(sys.argv[2])
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        stub.Health(pb.HealthRequest(), timeout=10)  # connected before the first mark
        print("READY", flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            try:
                stub.Health(pb.HealthRequest(), timeout=10)
                status = "OK"
            except grpc.RpcError as exc:
                status = exc.code().name
            print(f"{start:.4f} {(time.monotonic() - start) * 1e3:.2f} {status}", flush=True)
            if select.select([sys.stdin], [], [], 0.01)[0]:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
