"""`[server] frontends = 2`: a supervisor, one engine process and two gRPC frontends on one
port, run as systemd runs the daemon, against what one process answers."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from tensord_client import Client
from tests.conftest import serve, wait_generator_idle
from tests.e2e.conftest import Daemon, listening_port, log_events, wait_serving

X = np.random.default_rng(7).standard_normal((3, 512)).astype(np.float32)


def spawn(
    repo: Path, tmp_path: Path, frontends: int = 2, extra: str = "", server: str = ""
) -> subprocess.Popen[str]:
    """The daemon on `repo`; `extra` holds more tables, `server` more [server] keys."""
    config = tmp_path / "tensord.toml"
    if "drain_grace_seconds" not in server:
        server += "\ndrain_grace_seconds = 10"
    config.write_text(
        f'model_repository = "{repo}"\n{extra}\n[server]\nlisten = "127.0.0.1:0"\n'
        f'frontends = {frontends}\nlog_format = "json"\n{server}\n'
    )
    log_path = tmp_path / "tensord.log"
    with log_path.open("w") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "tensord.cli", "serve", "--config", str(config)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def start(
    repo: Path, tmp_path: Path, frontends: int = 2, extra: str = "", server: str = ""
) -> Daemon:
    process = spawn(repo, tmp_path, frontends, extra, server)
    log_path = tmp_path / "tensord.log"
    try:
        target = f"127.0.0.1:{listening_port(log_path, process)}"
        wait_serving(target)
        _wait(lambda: _event(log_path, "supervisor.ready") is not None, log_path)
    except BaseException:
        process.kill()
        process.wait(10)
        raise
    return Daemon(process, target, log_path)


def _event(log_path: Path, name: str, **fields: Any) -> dict[str, Any] | None:
    return next(
        (
            e
            for e in log_events(log_path)
            if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())
        ),
        None,
    )


def _wait(condition: Any, log_path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, log_path.read_text()[-5000:]
        time.sleep(0.05)


def pids(daemon: Daemon, role: str) -> list[int]:
    """The processes the supervisor started in `role`, oldest first."""
    return [
        int(e["pid"])
        for e in log_events(daemon.log_path)
        if e.get("event") == "supervisor.started_child" and e.get("role") == role
    ]


@pytest.fixture(scope="module")
def two(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = start(demo_repo, tmp_path_factory.mktemp("frontends"))
    yield daemon
    if daemon.process.poll() is None:
        daemon.process.kill()
        daemon.process.wait(10)


def test_processes_and_roles(two: Daemon) -> None:
    assert len(pids(two, "engine")) == 1 and len(pids(two, "frontend")) == 2
    roles = {e.get("role") for e in log_events(two.log_path) if "role" in e}
    assert {"engine", "frontend-0", "frontend-1"} <= roles
    # The engine holds the models; no frontend loaded one.
    loaded = [e for e in log_events(two.log_path) if e.get("event") == "model.loaded"]
    assert loaded and {e["role"] for e in loaded} == {"engine"}


def test_predict_equals_onnx_runtime_across_connections(two: Daemon, demo_repo: Path) -> None:
    session = ort.InferenceSession(str(demo_repo / "mlp" / "1" / "model.onnx"))
    expected = session.run(None, {"input": X})[0]
    # SO_REUSEPORT balances connections: several clients reach both frontends.
    clients = [
        Client(two.target, timeout=10, retries=0, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(6)
    ]
    try:
        with ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(lambda c: [c.predict("mlp", {"input": X}) for _ in range(20)],
                                 clients))  # fmt: skip
    finally:
        for c in clients:
            c.close()
    assert all(np.array_equal(o["output"], expected) for batch in outs for o in batch)


def test_errors_match_one_process(two: Daemon, demo_repo: Path) -> None:
    one = serve(demo_repo)
    try:
        a = Client(two.target, timeout=10, retries=0)
        b = Client(one.target, timeout=10, retries=0)
        with a, b:
            for call in (
                lambda c: c.predict("mlp", {"input": np.zeros((2, 7), np.float32)}),
                lambda c: c.predict("nope", {"input": X}),
                lambda c: c.predict("mlp", {"wrong": X}),
                lambda c: list(c.generate("mlp", "hi")),
                lambda c: c.predict("tinylm", {"input": X}),
                lambda c: list(c.generate("tinylm", "hi", temperature=-1)),
            ):
                errors = []
                for client in (a, b):
                    with pytest.raises(grpc.RpcError) as caught:
                        call(client)
                    errors.append((caught.value.code(), caught.value.details()))
                assert errors[0] == errors[1]
    finally:
        one.stop()


def test_generate_equals_one_process(two: Daemon, demo_repo: Path) -> None:
    one = serve(demo_repo)
    # Text prompts are tokenised by the frontends; a long one on a worker thread.
    prompts = ["Once upon a time", "the quick brown fox", "hello", "a b c d e f " * 200]
    try:
        a = Client(two.target, timeout=30, retries=0)
        b = Client(one.target, timeout=30, retries=0)
        with a, b:

            def tokens(client: Client, prompt: str) -> list[int]:
                chunks = client.generate("tinylm", prompt, max_tokens=24, temperature=0,
                                         ignore_eos=True)  # fmt: skip
                return [t for c in chunks for t in c.token_ids]

            with ThreadPoolExecutor(4) as pool:  # streams share the engine's batch
                together = list(pool.map(lambda p: tokens(a, p), prompts))
            alone = [tokens(b, p) for p in prompts]
        assert together == alone and all(len(t) == 24 for t in alone)
    finally:
        one.stop()


def test_cancel_frees_kv_blocks_and_deadlines_hold(two: Daemon) -> None:
    with Client(two.target, timeout=30, retries=0) as client:
        stream = client.generate("tinylm", token_ids=[5, 6, 7], max_tokens=2000, temperature=0,
                                 ignore_eos=True)  # fmt: skip
        next(stream)
        stream.close()  # cancels the call
        status = wait_generator_idle(client, "tinylm", timeout=5)
        assert (status.running, status.waiting, status.kv_cache.used_blocks) == (0, 0, 0)
        with pytest.raises(grpc.RpcError) as caught:
            list(client.generate("tinylm", token_ids=[5, 6, 7], max_tokens=2000,
                                 ignore_eos=True, timeout=0.3))  # fmt: skip
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        status = wait_generator_idle(client, "tinylm", timeout=5)
        assert status.kv_cache.used_blocks == 0


def test_health_info_and_kserve(two: Daemon) -> None:
    with Client(two.target, timeout=10, retries=0) as client:
        health = client.health()
        assert {m.name for m in health.models} == {"classifier", "cnn", "mlp", "tinylm"}
        info = client.info()
        assert {m.name for m in info.models} == {"classifier", "cnn", "mlp", "tinylm"}
        assert dict(info.endpoints)["tensord.v1.InferenceService"] == two.target
    tritonclient = pytest.importorskip("tritonclient.grpc")
    kserve = tritonclient.InferenceServerClient(two.target)
    assert kserve.is_server_ready() and kserve.is_model_ready("mlp")
    x = tritonclient.InferInput("input", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    result = kserve.infer("mlp", [x])
    assert result.as_numpy("output").shape == (3, 10)


def test_a_killed_frontend_is_started_again(demo_repo: Path, tmp_path: Path) -> None:
    daemon = start(demo_repo, tmp_path)
    try:
        first = pids(daemon, "frontend")
        os.kill(first[0], signal.SIGKILL)
        _wait(lambda: len(pids(daemon, "frontend")) == 3, daemon.log_path)
        _wait(lambda: _event(daemon.log_path, "server.ready", role="frontend-0") is not None
              and len([e for e in log_events(daemon.log_path) if e.get("event") == "server.ready"
                       and e.get("role") == "frontend-0"]) == 2, daemon.log_path)  # fmt: skip
        with Client(daemon.target, timeout=10, retries=3) as client:
            for _ in range(10):
                assert client.predict("mlp", {"input": X})["output"].shape == (3, 10)
        assert daemon.terminate() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_a_killed_engine_is_started_again_then_gives_up(demo_repo: Path, tmp_path: Path) -> None:
    daemon = start(demo_repo, tmp_path)
    try:
        with Client(daemon.target, timeout=10, retries=0) as client:
            os.kill(pids(daemon, "engine")[0], signal.SIGKILL)
            _wait(lambda: len(pids(daemon, "engine")) == 2, daemon.log_path)
            codes = set()
            deadline = time.monotonic() + 60
            while True:  # UNAVAILABLE while the new engine loads, then answers again
                try:
                    client.predict("mlp", {"input": X})
                    break
                except grpc.RpcError as exc:
                    codes.add(exc.code())
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            assert codes <= {grpc.StatusCode.UNAVAILABLE}, codes
            for n in (2, 3):  # the second and third death in 60 s: the daemon gives up
                _wait(lambda n=n: _event(daemon.log_path, "engine.ready") is not None
                      and len(pids(daemon, "engine")) == n, daemon.log_path)  # fmt: skip
                time.sleep(0.5)
                os.kill(pids(daemon, "engine")[-1], signal.SIGKILL)
        assert daemon.process.wait(60) == 4
        assert _event(daemon.log_path, "supervisor.engine_failing") is not None
        for pid in pids(daemon, "frontend"):
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_sigterm_drains_frontends_then_the_engine(test_repo: Path, tmp_path: Path) -> None:
    daemon = start(test_repo, tmp_path)
    try:
        rng = np.random.default_rng(0)
        slow = {"x": rng.normal(size=(256, 1024)).astype(np.float32)}
        with Client(daemon.target, timeout=60, retries=0) as client, ThreadPoolExecutor(6) as pool:
            calls = [pool.submit(client.predict, "slow", slow) for _ in range(6)]
            deadline = time.monotonic() + 30
            while _arrived(client, "slow") < 6:  # queued or running when SIGTERM comes
                assert time.monotonic() < deadline, _arrived(client, "slow")
                time.sleep(0.01)
            daemon.process.send_signal(signal.SIGTERM)
            results = [c.result(timeout=60) for c in calls]
        assert all(r["y"].shape == (256, 1024) for r in results)
        assert daemon.process.wait(60) == 0
        order = [
            (e["event"], e.get("role"))
            for e in log_events(daemon.log_path)
            if e.get("event") in ("server.stopped", "engine.stopped", "supervisor.stopped")
        ]
        assert order[-1] == ("supervisor.stopped", None)
        assert order[-2] == ("engine.stopped", "engine")
        assert sorted(order[:-2]) == [
            ("server.stopped", "frontend-0"),
            ("server.stopped", "frontend-1"),
        ]
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def _arrived(client: Client, model: str) -> int:
    """Runs that reached `model`'s executor: started (done or not) or queued, from Info."""
    (status,) = [m.executor_status for m in client.info().models if m.name == model]
    return sum(lane.runs for lane in status.lanes) + status.queue_depth


def test_a_second_daemon_on_the_port_is_refused(
    two: Daemon, demo_repo: Path, tmp_path: Path
) -> None:
    config = tmp_path / "second.toml"
    config.write_text(
        f'model_repository = "{demo_repo}"\n[server]\nlisten = "{two.target}"\nfrontends = 2\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "tensord.cli", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "another tensord serves it" in done.stderr


def test_sighup_reloads_the_engine(demo_repo: Path, tmp_path: Path) -> None:
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(demo_repo, repo, ignore=shutil.ignore_patterns("tinylm", "classifier"))
    daemon = start(repo, tmp_path)
    try:
        with Client(daemon.target, timeout=10, retries=0) as client:
            assert {m.name for m in client.health().models} == {"cnn", "mlp"}
            shutil.copytree(repo / "mlp", repo / "mlp2")
            config = tmp_path / "tensord.toml"  # a restart-only key changed: kept everywhere
            config.write_text(config.read_text() + "\n[limits]\nmax_generate_streams = 3\n")
            daemon.process.send_signal(signal.SIGHUP)
            _wait(lambda: _event(daemon.log_path, "engine.reloaded") is not None, daemon.log_path)
            _wait(lambda: "mlp2" in {m.name for m in client.health().models}, daemon.log_path)
            assert client.predict("mlp2", {"input": X})["output"].shape == (3, 10)
            ignored = "reload.ignored_until_restart"
            key = "limits.max_generate_streams"
            for role in ("engine", "frontend-0", "frontend-1", None):
                seen = functools.partial(_event, daemon.log_path, ignored, key=key, role=role)
                _wait(seen, daemon.log_path)
        assert daemon.terminate() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_tokens_are_checked_by_every_frontend(demo_repo: Path, tmp_path: Path) -> None:
    from tensord.server.auth import hash_token, token_entry

    tokens = tmp_path / "tokens.toml"
    tokens.write_text(token_entry("alice", hash_token("a" * 32), ["mlp"]))
    daemon = start(demo_repo, tmp_path, extra=f'[auth]\ntoken_file = "{tokens}"')
    try:
        for _ in range(4):  # new connections: both frontends
            with Client(daemon.target, timeout=10, retries=0, token="a" * 32,
                        options=[("grpc.use_local_subchannel_pool", 1)]) as client:  # fmt: skip
                assert client.predict("mlp", {"input": X})["output"].shape == (3, 10)
                with pytest.raises(grpc.RpcError) as caught:
                    client.predict("cnn", {"input": np.zeros((1, 3, 32, 32), np.float32)})
                assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with Client(daemon.target, timeout=10, retries=0,
                        options=[("grpc.use_local_subchannel_pool", 1)]) as anonymous:  # fmt: skip
                with pytest.raises(grpc.RpcError) as caught:
                    anonymous.predict("mlp", {"input": X})
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_frontends_auto_is_none_below_eight_cores() -> None:
    from tensord.config import load_config
    from tensord.procs.supervisor import frontend_count

    config = load_config(None, env={}, overrides={"server.frontends": "auto"})
    assert frontend_count(config, cores=2) == 0 and frontend_count(config, cores=7) == 0
    assert frontend_count(config, cores=8) == 2 and frontend_count(config, cores=16) == 6
    assert json.loads(config.model_dump_json())["server"]["frontends"] == "auto"


def test_frontends_are_refused_off_x86_64() -> None:
    """The rings rely on x86-64's memory ordering: elsewhere `auto` means none and a number
    is refused with the reason; x86-64 by any of its names takes it."""
    from tensord.config import load_config
    from tensord.procs.supervisor import frontend_count

    two = load_config(None, env={}, overrides={"server.frontends": 2})
    auto = load_config(None, env={}, overrides={"server.frontends": "auto"})
    with pytest.raises(RuntimeError) as refused:
        frontend_count(two, machine="aarch64")
    assert str(refused.value).startswith(
        "[server] frontends = 2 needs an x86-64 host, and this one is aarch64"
    )
    assert "set [server] frontends = 0" in str(refused.value)
    assert frontend_count(auto, cores=64, machine="aarch64") == 0
    none = load_config(None, env={}, overrides={"server.frontends": 0})
    assert frontend_count(none, machine="arm64") == 0
    assert frontend_count(two, machine="x86_64") == frontend_count(two, machine="AMD64") == 2


def test_metrics_add_up_every_process(demo_repo: Path, tmp_path: Path) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    daemon = start(demo_repo, tmp_path, extra='[metrics]\nlisten = "127.0.0.1:0"')
    try:
        (event,) = [
            e for e in log_events(daemon.log_path)
            if e.get("event") == "metrics.listening" and "role" not in e
        ]  # fmt: skip
        for _ in range(4):  # new connections: both frontends count calls
            with Client(daemon.target, timeout=10, retries=0,
                        options=[("grpc.use_local_subchannel_pool", 1)]) as client:  # fmt: skip
                for _ in range(5):
                    client.predict("mlp", {"input": X})
                list(client.generate("tinylm", "hi", max_tokens=3, temperature=0))
        url = f"http://127.0.0.1:{event['port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        found = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

        def value(name: str, **labels: str) -> float:
            return found[(name, frozenset(labels.items()))]

        assert value("tensord_requests_total", rpc="Predict", model="mlp", code="OK") == 20
        assert value("tensord_requests_total", rpc="Generate", model="tinylm", code="OK") == 4
        assert value("tensord_executor_runs_total", model="mlp", version="1") == 20  # the engine
        assert value("tensord_model_versions", state="ready") == 4
        assert value("tensord_generated_tokens_total", model="tinylm") >= 12
        assert value("tensord_build_info", version=__import__("tensord").__version__) == 1
        assert value("tensord_metrics_children_missing") == 0
        assert value("process_cpu_seconds_total") > 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_the_openai_api_on_every_frontend(demo_repo: Path, tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    import urllib.request

    daemon = start(demo_repo, tmp_path, extra='[openai]\nlisten = "127.0.0.1:0"')
    one = serve(demo_repo)
    try:
        ports = {
            e["port"] for e in log_events(daemon.log_path) if e.get("event") == "openai.listening"
        }
        assert len(ports) == 1  # both frontends on the one port the supervisor holds
        url = f"http://127.0.0.1:{ports.pop()}/v1/completions"
        body = {"model": "tinylm", "prompt": "Once upon a time", "max_tokens": 8,
                "temperature": 0, "logprobs": 2}  # fmt: skip
        answers = []
        for _ in range(4):  # new connections: both frontends
            request = urllib.request.Request(
                url, json.dumps(body).encode(), {"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=30) as answer:
                answers.append(json.load(answer)["choices"][0])
        with Client(one.target, timeout=30, retries=0) as client:
            chunks = list(client.generate("tinylm", "Once upon a time", max_tokens=8,
                                          temperature=0))  # fmt: skip
        text = "".join(c.text for c in chunks)
        assert all(a["text"] == text for a in answers)
        assert all(len(a["logprobs"]["tokens"]) == 8 for a in answers)
    finally:
        one.stop()
        if daemon.process.poll() is None:
            daemon.process.kill()


def _ring_full(error: BaseException) -> bool:
    return (
        isinstance(error, grpc.RpcError)
        and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        and "ring is full" in (error.details() or "")
    )


def test_a_full_ring_answers_resource_exhausted(demo_repo: Path, tmp_path: Path) -> None:
    """With the engine stopped, requests fill a frontend's ring (4 MiB with 1 MiB messages,
    so about 14 of 245 KB and the room kept for one more):
    the next ones get RESOURCE_EXHAUSTED at once; once the engine runs again, all serve."""
    daemon = start(demo_repo, tmp_path, 1, server="max_receive_message_bytes = 1048576")
    big = np.zeros((120, 512), np.float32)  # 240 KB of tensor
    engine = pids(daemon, "engine")[0]
    try:
        with Client(daemon.target, timeout=30, retries=0) as client, ThreadPoolExecutor(32) as pool:
            os.kill(engine, signal.SIGSTOP)
            try:
                waiting, refused = [], None
                while refused is None and len(waiting) < 32:
                    call = pool.submit(client.predict, "mlp", {"input": big})
                    try:
                        call.exception(timeout=0.2)  # refused at once, or it waits
                    except TimeoutError:
                        waiting.append(call)
                        continue
                    refused = call.exception()
                assert refused is not None and _ring_full(refused), refused
            finally:
                os.kill(engine, signal.SIGCONT)
            # A refusal slower than 0.2 s (a loaded host) was counted as waiting: it is
            # the same refusal. The calls in the ring are served once the engine runs.
            late = [e for e in (w.exception(30) for w in waiting) if e is not None]
            assert all(_ring_full(e) for e in late), late
            served = [w.result() for w in waiting if w.exception() is None]
            assert len(served) >= 3 and all(r["output"].shape == (120, 10) for r in served)
            assert client.predict("mlp", {"input": big})["output"].shape == (120, 10)
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_mutual_tls_on_every_frontend(demo_repo: Path, tmp_path: Path) -> None:
    from tensord_client import TLSOptions
    from tests.certs import CertificateAuthority

    ca = CertificateAuthority(tmp_path, "frontends CA")
    server = ca.issue("tensord.test", server=True, stem="server")
    mine = ca.issue("client-1", server=False)
    tls = (
        f'[tls]\ncert_file = "{server.cert_file}"\nkey_file = "{server.key_file}"\n'
        f'client_ca_file = "{ca.cert_file}"'
    )
    process = spawn(demo_repo, tmp_path, extra=tls)
    try:
        port = listening_port(tmp_path / "tensord.log", process)
        _wait(lambda: _event(tmp_path / "tensord.log", "supervisor.ready") is not None,
              tmp_path / "tensord.log")  # fmt: skip
        options = TLSOptions(ca.cert_file, certificate_chain=mine.cert_file,
                             private_key=mine.key_file)  # fmt: skip
        for _ in range(4):  # new connections: both frontends
            with Client(f"127.0.0.1:{port}", timeout=10, retries=0, tls=options,
                        options=[("grpc.use_local_subchannel_pool", 1)]) as client:  # fmt: skip
                assert client.predict("mlp", {"input": X})["output"].shape == (3, 10)
            with Client(f"127.0.0.1:{port}", timeout=5, retries=0, tls=TLSOptions(ca.cert_file),
                        options=[("grpc.use_local_subchannel_pool", 1)]) as stranger:  # fmt: skip
                with pytest.raises(grpc.RpcError) as caught:
                    stranger.health()
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # no handshake
    finally:
        process.kill()
        process.wait(10)


def test_drain_ends_running_streams_with_unavailable(demo_repo: Path, tmp_path: Path) -> None:
    process = spawn(demo_repo, tmp_path, server="drain_grace_seconds = 2")
    log_path = tmp_path / "tensord.log"
    try:
        port = listening_port(log_path, process)
        _wait(lambda: _event(log_path, "supervisor.ready") is not None, log_path)
        with Client(f"127.0.0.1:{port}", timeout=30, retries=0) as client:
            stream = client.generate("tinylm", token_ids=[5, 6, 7], max_tokens=2000,
                                     ignore_eos=True)  # fmt: skip
            next(stream)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as caught:
                for _ in stream:
                    pass
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in caught.value.details()
            assert time.monotonic() - started < 5
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_children_end_when_the_supervisor_is_killed(demo_repo: Path, tmp_path: Path) -> None:
    """SIGKILL leaves no orphan: each child sees its control channel close and drains."""
    daemon = start(demo_repo, tmp_path)
    children = pids(daemon, "engine") + pids(daemon, "frontend")
    daemon.process.kill()
    daemon.process.wait(10)
    deadline = time.monotonic() + 30
    alive = children
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    assert not alive, f"children still running: {alive}"
    with pytest.raises(grpc.RpcError):
        Client(daemon.target, timeout=2, retries=0).health()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_children_get_the_serve_arguments_without_listen() -> None:
    from tensord.cli import _serve_args

    given = ["serve", "--config", "a.toml", "--listen", "0.0.0.0:1", "--log-level=debug",
             "--listen=[::]:2", "--model-repository", "m"]  # fmt: skip
    assert _serve_args(given) == ["--config", "a.toml", "--log-level=debug",
                                  "--model-repository", "m"]  # fmt: skip
    assert _serve_args(["check-config"]) == []


def test_max_generate_streams_holds_across_frontends(demo_repo: Path, tmp_path: Path) -> None:
    """[limits] max_generate_streams = 2 is the daemon's, whichever frontends the streams
    reach: the engine counts them all."""
    daemon = start(demo_repo, tmp_path, extra="[limits]\nmax_generate_streams = 2")
    clients = [
        Client(
            daemon.target, timeout=30, retries=0, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(6)
    ]
    try:
        running, refused = [], []
        for client in clients:  # six connections: both frontends get some
            stream = client.generate("tinylm", token_ids=[5, 6, 7], max_tokens=2000,
                                     ignore_eos=True)  # fmt: skip
            try:
                next(stream)
                running.append(stream)
            except grpc.RpcError as exc:
                refused.append(exc)
        assert len(running) == 2 and len(refused) == 4
        assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused)
        assert all("max_generate_streams = 2" in e.details() for e in refused)
        running[0].close()  # a slot comes back
        deadline = time.monotonic() + 10
        while True:
            try:
                next(clients[-1].generate("tinylm", token_ids=[5], max_tokens=2))
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        for client in clients:
            client.close()
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_frontends_that_cannot_start_end_the_daemon(demo_repo: Path, tmp_path: Path) -> None:
    """A frontend failing at start (here a certificate that does not parse) is started
    again; after 5 deaths in 60 s the daemon exits 4 rather than spin."""
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    process = spawn(demo_repo, tmp_path, extra=f'[tls]\ncert_file = "{bad}"\nkey_file = "{bad}"')
    try:
        assert process.wait(90) == 4
        log_path = tmp_path / "tensord.log"
        assert _event(log_path, "supervisor.frontends_failing") is not None
        assert len(pids(Daemon(process, "", log_path), "frontend")) >= 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_an_openai_prompt_beyond_the_ring_is_refused_as_one_process(
    demo_repo: Path, tmp_path: Path
) -> None:
    """With 4 MiB messages (an 8 MiB ring) and bodies, an OpenAI completion's prompt of a
    million tokens (text or ids) passes the HTTP body limit; one process answers 400 for
    the model's context, and so must a frontend, not 429 for the room its tokens would
    take in the ring to the engine."""
    pytest.importorskip("starlette")
    import urllib.error
    import urllib.request

    limit = "max_receive_message_bytes = 4194304"
    openai = '[openai]\nlisten = "127.0.0.1:0"\nmax_body_bytes = 4194304'
    daemon = start(demo_repo, tmp_path, extra=openai, server=limit)
    one = serve(
        demo_repo,
        openai__listen="127.0.0.1:0",
        openai__max_body_bytes=4194304,
        server__max_receive_message_bytes=4194304,
    )
    try:
        (port,) = {
            e["port"] for e in log_events(daemon.log_path) if e.get("event") == "openai.listening"
        }

        def answer(port: int, prompt: Any) -> tuple[int, str]:
            body = json.dumps({"model": "tinylm", "prompt": prompt, "max_tokens": 4}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"content-type": "application/json"})  # fmt: skip
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(request, timeout=30)
            return caught.value.code, json.load(caught.value)["error"]["message"]

        for prompt in ([5] * 1_000_000, "x" * 1_000_000):
            two_says = answer(port, prompt)
            assert two_says == answer(one.server.openai.port, prompt)
            assert two_says[0] == 400 and "context" in two_says[1], two_says
            assert "2048 tokens" in two_says[1], two_says
        with Client(daemon.target, timeout=10, retries=0) as client:
            assert client.predict("mlp", {"input": X})["output"].shape == (3, 10)
        assert _event(daemon.log_path, "supervisor.child_exited") is None
    finally:
        one.stop()
        if daemon.process.poll() is None:
            daemon.process.kill()
