"""The daemon as systemd runs it: a subprocess, probed by health, driven by the client
and tensorctl, stopped with SIGTERM while calls are in flight."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from tensord_client import Client
from tests.e2e.conftest import (
    Daemon,
    log_events,
    spawn_daemon,
    start_daemon,
    wait_for_event,
)

pytestmark = pytest.mark.e2e


def tensorctl(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensord_client.cli", "--target", daemon.target, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_startup_logs_one_line_per_model(daemon: Daemon) -> None:
    events = log_events(daemon.log_path)
    loaded = {e["model"]: e for e in events if e["event"] == "model.loaded"}
    assert set(loaded) == {"mlp", "cnn", "classifier", "tinylm"}
    for entry in loaded.values():
        assert {"version", "backend", "provider", "executor", "load_ms"} <= set(entry)
    ready = next(e for e in events if e["event"] == "server.ready")
    assert ready["ready"] == 4 and ready["failed"] == 0
    # The long-lived heap is frozen once the models are in, before the first request.
    names = [e["event"] for e in events]
    assert names.index("server.heap_frozen") < names.index("server.ready")
    frozen = next(e for e in events if e["event"] == "server.heap_frozen")
    assert frozen["objects"] > 10_000 and frozen["collect_ms"] >= 0
    # uvloop is a dependency on Linux: the daemon runs on it by default (event_loop "auto").
    import uvloop

    listening = next(e for e in events if e["event"] == "server.listening")
    assert listening["event_loop"] == f"uvloop {uvloop.__version__}"


def test_client_and_cli(daemon: Daemon, demo_repo: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(3).normal(size=(2, 512)).astype(np.float32)
    with Client(daemon.target) as client:
        out = client.predict("mlp", {"input": x})["output"]
    assert out.shape == (2, 10)

    health = tensorctl(daemon, "health")
    assert health.returncode == 0, health.stderr
    assert health.stdout.splitlines()[0] == "server: SERVING"
    assert ["mlp", "1", "READY"] in [line.split() for line in health.stdout.splitlines()]

    table = {line.split()[0]: line for line in tensorctl(daemon, "info").stdout.splitlines()}
    assert table["mlp"].split()[3] == "predict" and "input:float32[-1, 512]" in table["mlp"]
    assert table["tinylm"].split()[3] == "generator" and "token stream" in table["tinylm"]

    info = json.loads(tensorctl(daemon, "--json", "info").stdout)
    assert sorted(m["name"] for m in info["models"]) == ["classifier", "cnn", "mlp", "tinylm"]
    assert info["runtime"]["event_loop"].startswith("uvloop ")

    np.save(tmp_path / "x.npy", x)
    written = tensorctl(
        daemon,
        "predict",
        "mlp",
        "--input",
        f"input={tmp_path / 'x.npy'}",
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert written.returncode == 0, written.stderr
    assert np.load(tmp_path / "out" / "output.npy").tobytes() == out.tobytes()

    inline = tensorctl(
        daemon, "--json", "predict", "mlp", "--input", f"input={json.dumps([[0.5] * 512])}"
    )
    assert inline.returncode == 0, inline.stderr
    result = json.loads(inline.stdout)["output"]
    assert result["dtype"] == "float32" and result["shape"] == [1, 10]

    missing = tensorctl(daemon, "predict", "nope", "--input", "x=[1]")
    assert missing.returncode == 1
    assert missing.stderr.startswith("tensorctl: NOT_FOUND: model 'nope' not found")


def slow_input(batch: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(batch).normal(size=(batch, 1024)).astype(np.float32)}


def executor_counts(client: Client, model: str) -> tuple[int, int]:
    """From Info, `model`'s executor: (runs begun so far + runs queued, runs in flight now)."""
    status = next(m.executor_status for m in client.info().models if m.name == model)
    begun = sum(lane.runs for lane in status.lanes)
    return begun + status.queue_depth, status.queue_depth + status.running


def test_sigterm_drains_in_flight_calls(test_repo: Path, tmp_path: Path) -> None:
    daemon = start_daemon(test_repo, tmp_path / "tensord.log")
    try:
        with Client(daemon.target, timeout=60, retries=0) as client:
            compute_us = client.predict_response("slow", slow_input(64)).timing.compute_us
            batch = int(np.clip(64 * 200_000 / max(compute_us, 1), 8, 512))  # ~0.2 s per run
            with ThreadPoolExecutor(8) as pool:
                before, _ = executor_counts(client, "slow")
                calls = [pool.submit(client.predict, "slow", slow_input(batch)) for _ in range(8)]
                deadline = time.monotonic() + 30
                while True:  # until all eight reached the one instance's executor
                    arrived, in_flight = executor_counts(client, "slow")
                    if arrived - before == 8:
                        break
                    assert time.monotonic() < deadline, (arrived - before, in_flight)
                    time.sleep(0.01)
                assert in_flight > 0  # queued or running when SIGTERM comes (~0.2 s a run)
                daemon.process.send_signal(15)
                results = [c.result(timeout=60) for c in calls]
        assert all(r["y"].shape == (batch, 1024) for r in results)
        assert daemon.process.wait(60) == 0
        events = [e["event"] for e in log_events(daemon.log_path)]
        assert events[-2:] == ["server.draining", "server.stopped"]
        with (
            Client(daemon.target, timeout=2, retries=0) as client,
            pytest.raises(grpc.RpcError) as info,
        ):
            client.health()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_clients_that_hold_their_connection_do_not_hold_the_drain(
    demo_repo: Path, tmp_path: Path
) -> None:
    """With 30 s of grace and nothing in flight, SIGTERM ends the daemon at once, though a
    gRPC client that ignores GOAWAY keeps its connection open (one of its calls ended
    without its message), and an HTTP client sent only part of a body (it gets 503)."""
    import socket

    from tests.raw_h2 import RawConnection

    config = tmp_path / "tensord.toml"
    config.write_text('[server]\ndrain_grace_seconds = 30\n[openai]\nlisten = "127.0.0.1:0"\n')
    daemon = start_daemon(demo_repo, tmp_path / "tensord.log", "--config", str(config))
    try:
        wait_for_event(daemon.log_path, "openai.listening", daemon.process, 60)
        (port,) = {
            int(e["port"])
            for e in log_events(daemon.log_path)
            if e.get("event") == "openai.listening"
        }
        raw = RawConnection(daemon.target)
        ended = raw.wait(raw.start("/tensord.v1.InferenceService/Predict", end_stream=True))
        assert ended.status == grpc.StatusCode.INVALID_ARGUMENT.value[0], ended
        http = socket.create_connection(("127.0.0.1", port), timeout=10)
        http.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n{"
        )
        time.sleep(0.3)  # the request is in, waiting for the rest of its body
        start = time.monotonic()
        daemon.process.send_signal(15)
        answer = b""
        while b"}}" not in answer and (part := http.recv(4096)):  # the JSON error body's end
            answer += part
        assert daemon.process.wait(30) == 0
        took = time.monotonic() - start
        assert took < 5, took
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"shutting down before this request's body arrived" in answer
        http.close()
        raw.sock.close()
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_a_restart_on_the_same_port_after_sigkill_under_load(
    demo_repo: Path, tmp_path: Path
) -> None:
    """Killed outright while clients keep calling, a daemon started again on the same port
    serves: once health says SERVING, a new client's first call succeeds; twice over."""
    import threading

    daemon = start_daemon(demo_repo, tmp_path / "first.log")
    stop = threading.Event()
    answered = [0]

    def load() -> None:
        with Client(daemon.target, timeout=5, retries=0) as client:
            while not stop.is_set():
                try:
                    client.predict("mlp", {"input": np.zeros((1, 512), np.float32)})
                    answered[0] += 1
                except grpc.RpcError:
                    time.sleep(0.02)  # the daemon is down between the kill and the restart

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    process = daemon.process
    try:
        for round_ in range(2):
            deadline = time.monotonic() + 60
            while answered[0] < 20 * (round_ + 1):  # under load
                assert time.monotonic() < deadline, answered
                time.sleep(0.05)
            process.kill()
            process.wait(10)
            again = start_daemon(
                demo_repo, tmp_path / f"again-{round_}.log", "--listen", daemon.target
            )
            process = again.process
            assert again.target == daemon.target
            with Client(daemon.target, timeout=10, retries=0) as client:
                reply = client.predict("mlp", {"input": np.ones((1, 512), np.float32)})
            assert reply["output"].shape == (1, 10)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _slow_warm_up_model(path: Path, layers: int = 300, n: int = 1024) -> None:
    """A fixed [n, n] input through `layers` MatMuls: its warm-up run takes seconds."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, prev = [], "x"
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [prev, "W"], [f"h{i}"]))
        prev = f"h{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "warm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        [numpy_helper.from_array(np.eye(n, dtype=np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def test_sigterm_while_models_load_drains_at_once(tmp_path: Path) -> None:
    _slow_warm_up_model(tmp_path / "repo" / "warm" / "1" / "model.onnx")
    log_path = tmp_path / "tensord.log"
    process = spawn_daemon(tmp_path / "repo", log_path)
    try:
        wait_for_event(log_path, "server.devices", process)  # loading has begun
        time.sleep(0.3)
        start = time.monotonic()
        process.send_signal(15)
        assert process.wait(60) == 0
        took = time.monotonic() - start
        events = [e["event"] for e in log_events(log_path)]
        assert "model.loaded" not in events  # the warm-up (several seconds) was not awaited
        assert events[-3:] == ["server.draining", "server.stopped", "server.exit_during_load"]
        assert took < 5, took
    finally:
        if process.poll() is None:
            process.kill()


def test_bad_config_exits_with_the_field(tmp_path: Path) -> None:
    config = tmp_path / "tensord.toml"
    config.write_text('[server]\nlisten = "localhost"\n')
    result = subprocess.run(
        [sys.executable, "-m", "tensord.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "server.listen: expected HOST:PORT" in result.stderr


def test_inspect(demo_repo: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensord.cli",
            "inspect",
            "--json",
            str(demo_repo / "mlp" / "1" / "model.onnx"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(result.stdout)
    assert report["opsets"] == {"ai.onnx": 17}
    assert report["inputs"] == [
        {"name": "input", "dtype": "DATA_TYPE_FLOAT32", "shape": [-1, 512], "dims": ["batch", 512]}
    ]
    assert "CPUExecutionProvider" in report["runnable_providers"]
    assert report["producer"] == "tensord-demo"


def test_tensorctl_generate_streams_text(daemon: Daemon) -> None:
    live = tensorctl(daemon, "generate", "tinylm", "Once upon a time", "--max-tokens", "12",
                     "--temperature", "0", "--ignore-eos")  # fmt: skip
    assert live.returncode == 0, live.stderr
    assert "12 generated tokens" in live.stderr and "[length:" in live.stderr
    records = tensorctl(daemon, "--json", "generate", "tinylm", "--token-ids", "1,52,97",
                        "--max-tokens", "5", "--temperature", "0", "--ignore-eos",
                        "--logprobs", "2")  # fmt: skip
    assert records.returncode == 0, records.stderr
    chunks = [json.loads(line) for line in records.stdout.splitlines()]
    assert sum(len(c.get("token_ids", [])) for c in chunks) == 5
    assert chunks[-1]["finish_reason"] == "FINISH_REASON_LENGTH"
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert all(len(lp["top"]) == 2 for c in chunks for lp in c.get("logprobs", []))
    # The same greedy tokens as a second run: the output is reproducible.
    again = tensorctl(daemon, "--json", "generate", "tinylm", "--token-ids", "1,52,97",
                      "--max-tokens", "5", "--temperature", "0", "--ignore-eos")  # fmt: skip
    tokens = [t for c in chunks for t in c.get("token_ids", [])]
    assert [t for line in again.stdout.splitlines()
            for t in json.loads(line).get("token_ids", [])] == tokens  # fmt: skip
