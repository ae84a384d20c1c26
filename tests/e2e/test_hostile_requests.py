"""The worst single requests against the daemon as a subprocess, with a third process
probing Health and the systemd watchdog listening: nothing a request holds stalls either.

Each request is refused with a clear status before it costs the event loop: a million empty
tensors (32 MB), a 3 MB and a 20 MB text prompt, twenty million prompt token ids, eight
million typed floats. Meanwhile Health answers within 500 ms and WATCHDOG=1 keeps coming,
one late keep-alive at most. (Before the intake bounds these requests stalled both for
1.5-36 s; on a 2-core host the sender, the daemon's transport thread and the probe share
the cores, and scheduling alone has delayed single probe calls by up to ~180 ms.)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.e2e.conftest import Daemon, listening_port, spawn_daemon, wait_serving
from tests.fuzzing import field, varint
from tests.grpc.test_intake import EMPTY_TENSOR
from tests.health_probe import HealthProbe
from tests.notify_socket import NotifyListener

PREDICT = "/tensord.v1.InferenceService/Predict"
GENERATE = "/tensord.v1.InferenceService/Generate"
HEALTH_WITHIN_S = 0.5
WATCHDOG_USEC = 1_000_000  # WATCHDOG=1 every 0.5 s, each after a probe answered in 0.25 s
KEEPALIVE_GAP_S = 1.25
"""One probe that misses its 0.25 s leaves a 1 s gap; two in a row, or a stall, more."""

pytestmark = pytest.mark.e2e


def _typed_floats(rows: int) -> bytes:
    floats = np.zeros(rows * 512, np.float32).tobytes()
    tensor = (
        field(1, b"input") + field(2, 9) + field(3, varint(rows) + varint(512))
        + field(5, field(4, floats))
    )  # fmt: skip
    return field(1, b"mlp") + field(3, tensor)


CASES = {
    "6.4 million empty tensors": (
        PREDICT, field(1, b"mlp") + EMPTY_TENSOR * 6_400_000, "INVALID_ARGUMENT",
        "more than 256 input tensors",
    ),
    "a 3 MB prompt": (
        GENERATE, field(1, b"tinylm") + field(3, b"hello world " * 250_000),
        "INVALID_ARGUMENT", "the prompt takes 3000000 bytes",
    ),
    "a 20 MB prompt": (
        GENERATE, field(1, b"tinylm") + field(3, b"x" * 20_000_000), "INVALID_ARGUMENT",
        "the prompt takes 20000000 bytes",
    ),
    "20 million token ids": (
        GENERATE, field(1, b"tinylm") + field(4, varint(1000) * 20_000_000),
        "INVALID_ARGUMENT", "prompt_token_ids holds at least",
    ),
    "8 million typed floats": (
        PREDICT, _typed_floats(16384), "INVALID_ARGUMENT", "exceeds the model's max_batch_size",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def watched(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, list[float]]]:
    """A daemon under a watchdog, and the times its WATCHDOG=1 messages arrived."""
    listener = NotifyListener()
    log = tmp_path_factory.mktemp("hostile") / "tensord.log"
    env = listener.env(WATCHDOG_USEC=str(WATCHDOG_USEC))
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        process = spawn_daemon(demo_repo, log)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    beats: list[float] = []

    def listen() -> None:
        while process.poll() is None:
            message = listener.receive(0.2)
            if message and message.get("WATCHDOG") == "1":
                beats.append(time.monotonic())

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    target = f"127.0.0.1:{listening_port(log, process)}"
    wait_serving(target)
    yield Daemon(process, target, log), beats
    process.terminate()
    process.wait(30)


def _call(target: str, method: str, data: bytes) -> grpc.RpcError:
    options = [("grpc.max_send_message_length", 1 << 30)]
    with grpc.insecure_channel(target, options=options) as channel:
        if method == GENERATE:
            with pytest.raises(grpc.RpcError) as info:
                list(channel.unary_stream(method, request_serializer=None)(data, timeout=60))
        else:
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(method, request_serializer=None)(data, timeout=60)
    return info.value  # type: ignore[return-value]


@pytest.mark.parametrize("case", list(CASES))
def test_one_request_stalls_neither_health_nor_the_watchdog(
    watched: tuple[Daemon, list[float]], case: str
) -> None:
    daemon, beats = watched
    method, data, code, words = CASES[case]
    with HealthProbe(daemon.target) as probe:
        sent = time.monotonic()
        error = _call(daemon.target, method, data)
        answered = time.monotonic()
        time.sleep(0.7)  # a watchdog period after the answer
        record = probe.stop()
    assert (error.code().name, words in error.details()) == (code, True), error.details()
    what = f"{case}, answered after {answered - sent:.3f} s"
    record.assert_answered(sent, within_s=HEALTH_WITHIN_S, what=what)
    window = [t for t in beats if t >= sent - 0.6]
    gaps = np.diff(window)
    assert len(window) >= 2 and gaps.max() < KEEPALIVE_GAP_S, (case, gaps.tolist())
