"""The fuzz tier: seeded mutations of Predict and Generate messages, random HTTP/2
frames and spoiled OpenAI request bodies, against the daemon as a subprocess, while a
third process probes Health.

For `TENSORD_FUZZ_SECONDS` (30 by default: `make test`; `make bench` runs longer), split
between mutated messages, raw frames and OpenAI bodies. A mutated message may be refused
with any status of the error table, never INTERNAL or UNKNOWN (that would be the
request's content breaking the daemon). Raw frames may be answered by gRPC's own protocol
errors or a closed connection. An OpenAI body gets 200, or 400, 404 or 413 with an error
in OpenAI's shape, never a 5xx. Throughout, Health answers within 500 ms (a stall is
seconds; on a shared 2-core host scheduling alone has delayed single calls by up to
~200 ms); afterwards the
daemon serves Predict and Generate as before and holds no KV block. A failure names the
seed and the case.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
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
from tests.e2e.conftest import Daemon, log_events, start_daemon, wait_for_event
from tests.fuzzing import (
    CALLER_MISTAKES,
    GENERATE,
    grpc_frame,
    mutate,
    openai_request,
    random_frames,
    seeds,
)
from tests.health_probe import HealthProbe
from tests.raw_h2 import RawConnection

pytestmark = pytest.mark.e2e

SECONDS = float(os.environ.get("TENSORD_FUZZ_SECONDS", "30"))
SEED = int(os.environ.get("TENSORD_FUZZ_SEED", "20261125"))
HEALTH_WITHIN_S = 0.5
Code = grpc.StatusCode
ALLOWED = CALLER_MISTAKES | {Code.DEADLINE_EXCEEDED, Code.OUT_OF_RANGE}
"""What a mutated message may get: the error table's answers to a caller's mistakes."""


CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
OPENAI_ALLOWED = frozenset({200, 400, 404, 413})


@pytest.fixture(scope="module")
def daemon(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """mlp and tinylm (with a chat template), and the OpenAI API on a port of its own."""
    folder = tmp_path_factory.mktemp("fuzz")
    repo = folder / "models"
    for name in ("mlp", "tinylm"):
        shutil.copytree(demo_repo / name, repo / name)
    tokenizer_config = repo / "tinylm" / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text())
    tokenizer_config.write_text(json.dumps({**settings, "chat_template": CHAT_TEMPLATE}))
    config = folder / "tensord.toml"
    config.write_text('[openai]\nlisten = "127.0.0.1:0"\n')
    d = start_daemon(repo, folder / "tensord.log", "--config", str(config))
    yield d
    d.terminate()


@pytest.fixture(scope="module")
def openai_port(daemon: Daemon) -> int:
    wait_for_event(daemon.log_path, "openai.listening", daemon.process)
    (port,) = {
        int(e["port"]) for e in log_events(daemon.log_path) if e.get("event") == "openai.listening"
    }
    return port


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
    end = time.monotonic() + SECONDS * 0.5
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
    end = time.monotonic() + SECONDS * 0.2
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


def _post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    """The status and the whole answer (a stream read to its end)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body, {"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _openai_error(answer: bytes) -> bool:
    """Whether an answer is an error in OpenAI's shape with a message."""
    try:
        error = json.loads(answer)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and bool(error.get("message")) and "code" in error


def test_openai_bodies_get_client_errors(
    daemon: Daemon, probe: HealthProbe, openai_port: int
) -> None:
    rng = np.random.default_rng(SEED + 2)
    statuses: Counter[int] = Counter()
    bad: list[str] = []
    end = time.monotonic() + SECONDS * 0.3
    index = 0
    while time.monotonic() < end:
        path, body = openai_request(rng)
        status, answer = _post(openai_port, path, body)
        statuses[status] += 1
        if status not in OPENAI_ALLOWED or (status != 200 and not _openai_error(answer)):
            bad.append(
                f"seed {SEED + 2} case {index}: {path} {body[:80]!r} -> {status} {answer[:200]!r}"
            )
        index += 1
    assert sum(statuses.values()) > 20 and statuses[200] and statuses[400], statuses
    assert not bad, (bad[:5], statuses)
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
