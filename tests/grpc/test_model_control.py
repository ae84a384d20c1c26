"""Model control on request ([server] model_control = "explicit"): Triton's repository
RPCs on the KServe service, driven by tritonclient as Triton's explicit mode is: the index,
loads and unloads, while other models take Predict load without a failure; memory that
comes back after unloads; the permission a token needs."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensord.server.auth import hash_token, token_entry
from tests.conftest import DaemonProcesses, ServerThread, serve
from tests.tools import require_module

CONTROL = "control-token-dddddddddddddddddddd"
USER = "user-token-eeeeeeeeeeeeeeeeeeeeeeee"
X = np.zeros((1, 512), np.float32)


def triton() -> Any:
    return require_module("tritonclient.grpc", "make test (it installs tritonclient)")


def states(client: Any) -> dict[str, tuple[str, str]]:
    """Each model of the index: (version, state)."""
    return {m.name: (m.version, m.state) for m in client.get_model_repository_index().models}


@pytest.fixture(scope="module")
def srv(small_repo: Path) -> Iterator[ServerThread]:
    server = serve(small_repo, server__model_control="explicit", server__load_models=["mlp"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def kserve(srv: ServerThread) -> Iterator[Any]:
    with triton().InferenceServerClient(srv.target) as client:
        yield client


def test_the_index_lists_every_model_of_the_repository(kserve: Any) -> None:
    found = states(kserve)
    assert found["mlp"] == ("1", "READY")
    assert found["cnn"] == ("", "UNAVAILABLE")
    ready = {m.name for m in kserve.get_model_repository_index().models}
    assert {"mlp", "cnn", "mlp_batched"} <= ready
    assert kserve.is_model_ready("mlp") and not kserve.is_model_ready("cnn")


def test_load_and_unload(kserve: Any) -> None:
    from tritonclient.utils import InferenceServerException

    kserve.load_model("cnn")
    assert states(kserve)["cnn"] == ("1", "READY")
    image = triton().InferInput("image", [1, 3, 32, 32], "UINT8")
    image.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.uint8))
    assert kserve.infer("cnn", [image]).as_numpy("probabilities").shape == (1, 10)
    kserve.load_model("cnn")  # loaded already: unchanged files, nothing happens
    kserve.unload_model("cnn")
    assert states(kserve)["cnn"] == ("", "UNAVAILABLE")
    with pytest.raises(InferenceServerException, match="not found"):
        kserve.infer("cnn", [image])
    kserve.unload_model("cnn")  # not loaded: nothing to do


def test_bad_control_requests(kserve: Any) -> None:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="model 'nope' not found"):
        kserve.load_model("nope")
    with pytest.raises(InferenceServerException, match=r"parameters\['config'\]"):
        kserve.load_model("cnn", config='{"max_batch_size": 8}')
    assert states(kserve)["cnn"] == ("", "UNAVAILABLE")


def test_loads_and_unloads_under_load_lose_no_call(kserve: Any, srv: ServerThread) -> None:
    """Predict on mlp keeps succeeding while cnn loads and unloads again and again, and
    mlp_batched is unloaded and loaded back."""
    from tensord_client import Client

    failures: list[BaseException] = []
    calls = 0
    stop = threading.Event()

    def predict() -> None:
        nonlocal calls
        with Client(srv.target, timeout=30, retries=0) as client:
            while not stop.is_set():
                try:
                    assert client.predict("mlp", {"input": X})["output"].shape == (1, 10)
                    calls += 1
                except BaseException as exc:  # every failure is reported below
                    failures.append(exc)

    workers = [threading.Thread(target=predict) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        for _ in range(4):
            kserve.load_model("cnn")
            kserve.load_model("mlp_batched")
            kserve.unload_model("cnn")
            kserve.unload_model("mlp_batched")
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
    assert failures == [] and calls > 0


def rss(pid: int) -> int:
    """A process's resident bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.in_process
@pytest.mark.timeout(180)
def test_memory_comes_back_after_unloads(small_repo: Path) -> None:
    """In the engine process of a daemon started for it, after the first load and unload
    of a model (10 MiB of weights), 20 more cycles leave the process at most max(5 %, 16 MiB)
    larger: each unload frees the session and gives the heap back (malloc_trim)."""
    overrides = {
        "model_repository": str(small_repo),
        "server.listen": "127.0.0.1:0",
        "server.model_control": "explicit",
    }
    daemon = DaemonProcesses(overrides, frontends=1).start()
    try:
        events = [json.loads(line) for line in daemon.log_path.read_text().splitlines()
                  if line.startswith("{")]  # fmt: skip
        started = [e for e in events if e.get("event") == "supervisor.started_child"]
        (engine,) = [e["pid"] for e in started if e["role"] == "engine"]
        with triton().InferenceServerClient(daemon.target) as client:
            client.load_model("mlp")
            client.unload_model("mlp")
            baseline = rss(engine)
            for _ in range(20):
                client.load_model("mlp")
                client.unload_model("mlp")
            grown = rss(engine) - baseline
    finally:
        daemon.stop()
    assert grown <= max(0.05 * baseline, 16 * 2**20), f"grew {grown >> 20} MiB"


def test_model_control_is_off_by_default(small_repo: Path) -> None:
    from tritonclient.utils import InferenceServerException

    server = serve(small_repo)
    try:
        with triton().InferenceServerClient(server.target) as client:
            assert states(client)["cnn"] == ("1", "READY")  # the index works in either mode
            with pytest.raises(InferenceServerException, match="model control is off"):
                client.unload_model("cnn")
            assert client.is_model_ready("cnn")
    finally:
        server.stop()


def test_explicit_mode_with_nothing_loaded_is_ready(small_repo: Path) -> None:
    """A daemon waiting to be asked for models says SERVING (tritonclient and Kubernetes
    wait for ready before they load anything)."""
    server = serve(small_repo, server__model_control="explicit")
    try:
        with triton().InferenceServerClient(server.target) as client:
            assert client.is_server_ready()
            assert all(m.state == "UNAVAILABLE" for m in client.get_model_repository_index().models)
    finally:
        server.stop()


def test_a_token_needs_model_control(small_repo: Path, tmp_path: Path) -> None:
    from tritonclient.utils import InferenceServerException

    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        token_entry("user", hash_token(USER), ["*"])
        + token_entry("operator", hash_token(CONTROL), ["*"])
        + "model_control = true\n"
    )
    server = serve(small_repo, auth__token_file=tokens, server__model_control="explicit")
    try:
        with triton().InferenceServerClient(server.target) as client:
            user = {"authorization": f"Bearer {USER}"}
            with pytest.raises(InferenceServerException, match="model_control = true"):
                client.load_model("cnn", headers=user)
            operator = {"authorization": f"Bearer {CONTROL}"}
            client.load_model("cnn", headers=operator)
            deadline = time.monotonic() + 10
            while not client.is_model_ready("cnn", headers=user) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.is_model_ready("cnn", headers=user)
            client.unload_model("cnn", headers=operator)
    finally:
        server.stop()


def test_tensord_v1_and_tensorctl(srv: ServerThread) -> None:
    """The same control in tensord.v1 (the Python client) and tensorctl."""
    import subprocess
    import sys

    from tensord_client import Client
    from tensord_client.errors import NotFound

    with Client(srv.target, timeout=60, retries=0) as client:
        index = {m.name: (m.version, m.state) for m in client.repository_index()}
        assert index["mlp"] == (1, "READY") and index["cnn"] == (0, "NOT_LOADED")
        client.load_model("cnn")
        assert {m.name for m in client.repository_index(ready=True)} >= {"mlp", "cnn"}
        assert client.unload_model("cnn") is True
        assert client.unload_model("cnn") is False
        with pytest.raises(NotFound):
            client.load_model("nope")

    def tensorctl(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tensord_client.cli", "--target", srv.target, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    done = tensorctl("load", "cnn")
    assert done.returncode == 0 and "cnn: loaded" in done.stdout, done.stderr
    listed = tensorctl("models")
    assert listed.returncode == 0
    assert any(line.split()[:3] == ["cnn", "1", "READY"] for line in listed.stdout.splitlines())
    done = tensorctl("unload", "cnn")
    assert done.returncode == 0 and "cnn: unloaded" in done.stdout
    missing = tensorctl("load", "nope")
    assert missing.returncode == 1 and "not found" in missing.stderr
