"""The fuzz tier: seeded mutations of Predict and Generate messages, and random HTTP/2
frames, against the daemon as a subprocess, while a third process probes Health.

For `TENSORD_FUZZ_SECONDS` (30 by default: `make test`; `make bench` runs longer), split
between mutated messages and raw frames. A mutated message may be refused with any status
of the error table, never INTERNAL or UNKNOWN (that would be the request's content
breaking the daemon). Raw frames may be answered by gRPC's own protocol errors or a closed
connection. Throughout, Health answers within 500 ms (a stall is seconds; on a shared
2-core host scheduling alone has delayed single calls by up to ~200 ms); afterwards the
daemon serves Predict and Generate as before and holds no KV block. A failure names the
seed and the case.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from tensord_client import Client
from tests.conftest import wait_generator_idle
from tests.e2e.conftest import Daemon, start_daemon
from tests.fuzzing import CALLER_MISTAKES, GENERATE, grpc_frame, mutate, random_frames, seeds
from tests.health_probe import HealthProbe
from tests.raw_h2 import RawConnection

pytestmark = pytest.mark.e2e

SECONDS = float(os.environ.get("TENSORD_FUZZ_SECONDS", "30"))
SEED = int(os.environ.get("TENSORD_FUZZ_SEED", "20261125"))
HEALTH_WITHIN_S = 0.5
Code = grpc.StatusCode
ALLOWED = CALLER_MISTAKES | {Code.DEADLINE_EXCEEDED, Code.OUT_OF_RANGE}
"""What a mutated message may get: the error table's answers to a caller's mistakes."""


@pytest.fixture(scope="module")
def daemon(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(demo_repo, tmp_path_factory.mktemp("fuzz") / "tensord.log")
    yield d
    d.terminate()


@pytest.fixture(scope="module")
def probe(daemon: Daemon) -> Iterator[HealthProbe]:
    """Health every 10 ms from a third process, for the whole module."""
    with HealthProbe(daemon.target, 3 * SECONDS + 60) as probe:
        yield probe


def _send(channel: grpc.Channel, method: str, data: bytes) -> Code:
    try:
        if method == GENERATE:
            call = channel.unary_stream(method, request_serializer=None)
            for _ in call(data, timeout=10):
                pass
        else:
            channel.unary_unary(method, request_serializer=None)(data, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return Code.OK


def test_mutated_messages_get_the_error_tables_answers(daemon: Daemon, probe: HealthProbe) -> None:
    rng = np.random.default_rng(SEED)
    cases = seeds()
    codes: Counter[str] = Counter()
    bad: list[str] = []
    end = time.monotonic() + SECONDS * 0.7
    options = [("grpc.max_send_message_length", 1 << 30)]
    with grpc.insecure_channel(daemon.target, options=options) as channel:
        index = 0
        while time.monotonic() < end:
            method, message = cases[int(rng.integers(len(cases)))]
            other = cases[int(rng.integers(len(cases)))][1]
            data = mutate(rng, message, other)
            code = _send(channel, method, data)
            codes[code.name] += 1
            if code not in ALLOWED:
                bad.append(f"seed {SEED} case {index}: {method} {data[:48]!r}... -> {code.name}")
            index += 1
    assert sum(codes.values()) > 100, codes
    assert not bad, (bad[:5], codes)


def test_random_frames_leave_the_daemon_serving(daemon: Daemon, probe: HealthProbe) -> None:
    rng = np.random.default_rng(SEED + 1)
    cases = seeds()
    end = time.monotonic() + SECONDS * 0.3
    host, port = daemon.target.rsplit(":", 1)
    rounds = 0
    while time.monotonic() < end:
        rounds += 1
        if rng.random() < 0.5:  # a proper connection, then calls whose frames lie
            with RawConnection(daemon.target, timeout=2) as conn:
                for _ in range(1 + int(rng.integers(4))):
                    method, message = cases[int(rng.integers(len(cases)))]
                    closed = rng.random() < 0.1
                    stream = conn.start(method, end_stream=closed)
                    if not closed and not conn.replies[stream].ended and not conn.goaway:
                        conn.send(stream, grpc_frame(rng, message), end_stream=rng.random() < 0.8)
                    conn.pump(0.05)
        else:  # the preface, then frames of any type, flags and stream
            with socket.create_connection((host, int(port)), timeout=2) as sock:
                sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\4\0\0\0\0\0")
                try:
                    sock.sendall(random_frames(rng, 1 + int(rng.integers(20))))
                    sock.settimeout(0.05)
                    sock.recv(65536)
                except OSError:  # the server may close the connection, as it should
                    pass
    assert rounds > 10
    assert daemon.process.poll() is None, daemon.log()[-2000:]


def test_afterwards_the_daemon_serves_and_was_never_stalled(
    daemon: Daemon, probe: HealthProbe
) -> None:
    with Client(daemon.target, timeout=30, retries=0) as client:
        out = client.predict("mlp", {"input": np.zeros((1, 512), np.float32)})
        assert out["output"].shape == (1, 10)
        chunks = list(client.generate("tinylm", "Hello", max_tokens=4, ignore_eos=True))
        assert sum(len(c.token_ids) for c in chunks) == 4
        status = wait_generator_idle(client, "tinylm")
        assert (status.running, status.kv_cache.used_blocks) == (0, 0)
    record = probe.stop()
    during = record.assert_answered(within_s=HEALTH_WITHIN_S, what="the fuzz tier")
    assert len(during) > 100, f"{len(during)} Health calls"
    assert daemon.process.poll() is None
