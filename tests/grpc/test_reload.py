"""Reload (what SIGHUP runs) on a real server under concurrent Predict load: models are
added, changed and removed, and not one request fails because of it."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto

from tensord.config import load_config
from tensord.registry.version import ModelState
from tensord_client import AsyncClient, Client
from tests.conftest import ServerThread
from tests.models import _build_double, build_identity, build_slow

X = np.arange(8, dtype=np.float32).reshape(2, 4)
SWAP_X = np.linspace(-1, 1, 16 * 512, dtype=np.float32).reshape(16, 512)


def build_swap(path: Path, layers: int) -> Path:
    """A model that takes a few ms a run (so runs queue on its one lane); the number of
    layers changes its output."""
    return build_slow(path, layers=layers, width=512)


def _replace_file(build, target: Path) -> None:  # type: ignore[no-untyped-def]
    """Write a model next to `target`, then rename it over (how a deploy swaps a file)."""
    staging = target.with_name("staging.onnx")
    build(staging)
    os.replace(staging, target)


@pytest.fixture
def repo(demo_repo: Path, tmp_path: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(demo_repo / "mlp", root / "mlp")
    build_swap(root / "swap" / "1" / "model.onnx", layers=24)
    (root / "swap" / "model.toml").write_text("max_batch_size = 16\ninstance_count = 1\n")
    build_slow(root / "gone" / "1" / "model.onnx", layers=48)
    (root / "gone" / "model.toml").write_text("max_batch_size = 256\ninstance_count = 1\n")
    return root


@dataclass
class Load:
    """Predict calls kept in flight on `mlp` and `swap` (enough that the executors always
    have a queue) until stopped; every failure is kept."""

    target: str
    ok: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    swap_outputs: set[float] = field(default_factory=set)
    """A value of each swap answer: one per model file served."""
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self, in_flight: int = 24) -> Load:
        self.thread = threading.Thread(target=asyncio.run, args=(self._main(in_flight),))
        self.thread.start()
        return self

    async def _main(self, in_flight: int) -> None:
        async with AsyncClient(self.target, timeout=10, retries=0) as client:
            await asyncio.gather(*(self._work(client, i) for i in range(in_flight)))

    async def _work(self, client: AsyncClient, index: int) -> None:
        mlp_input = np.full((1, 512), 0.25, np.float32)
        while not self.stop.is_set():
            model = "mlp" if index % 4 == 0 else "swap"
            try:
                if model == "swap":
                    y = (await client.predict("swap", {"x": SWAP_X}))["y"]
                    self.swap_outputs.add(float(y[3, 7]))
                else:
                    await client.predict("mlp", {"input": mlp_input})
                self.ok[model] += 1
            except grpc.RpcError as exc:
                self.errors.append(f"{model}: {exc.code().name}: {exc.details()}")

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)


@pytest.fixture
def server(repo: Path) -> Iterator[ServerThread]:
    config = load_config(
        None, env={}, overrides={"model_repository": str(repo), "server.listen": "127.0.0.1:0"}
    )
    srv = ServerThread(config).start()
    yield srv
    srv.stop()


def _wait(condition, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def slow_call(target: str) -> tuple[threading.Thread, dict[str, object]]:
    """A long request on `gone`, on a thread of its own; the dict gets its output (or its
    error)."""
    result: dict[str, object] = {}

    def call() -> None:
        with Client(target, timeout=60, retries=0) as client:
            x = np.full((256, 1024), 0.01, np.float32)
            try:
                result["y"] = client.predict("gone", {"x": x})["y"]
            except grpc.RpcError as exc:
                result["error"] = f"{exc.code().name}: {exc.details()}"

    thread = threading.Thread(target=call)
    thread.start()
    return thread, result


def reload_under_load(server: ServerThread, repo: Path, load: Load) -> None:
    """`gone` removed while a long call runs on it, `swap` changed while runs queue on its
    one lane, `new` added: the old swap drains on the side, then only the new one answers,
    and the long call finishes."""
    assert server.server is not None
    registry = server.server.registry
    _wait(lambda: load.ok["swap"] > 10 and load.ok["mlp"] > 10)
    assert len(load.swap_outputs) == 1
    before = next(iter(load.swap_outputs))
    # Runs are queued on swap's single lane when it is swapped.
    executor = registry.get("swap").executor
    assert executor is not None
    _wait(lambda: executor.stats().queue_depth > 2)
    old_swap = registry.get("swap")
    # A long request on the model about to be removed is running when the reload starts.
    slow, slow_result = slow_call(server.target)
    _wait(lambda: registry.get("gone").inflight.count == 1)
    shutil.rmtree(repo / "gone")
    _replace_file(lambda p: build_swap(p, 25), repo / "swap" / "1" / "model.onnx")
    build_identity(repo / "new" / "1" / "model.onnx", TensorProto.INT32)
    result = server.call(server.server.reload())

    assert result.ok, result
    assert result.models is not None
    assert result.models.added == ["new v1"]
    assert result.models.changed == ["swap v1"]
    assert result.models.removed == ["gone v1"]
    assert result.models.unchanged == 1  # mlp
    # The new swap model answers from now on (the old one drains on the side).
    # The old swap is freed once the requests queued on it have been answered; from
    # then on only the new model answers.
    _wait(lambda: old_swap.executor is None)
    assert old_swap.inflight.count == 0
    with Client(server.target, timeout=10, retries=0) as client:
        after = {float(client.predict("swap", {"x": SWAP_X})["y"][3, 7]) for _ in range(5)}
    assert len(after) == 1 and before not in after
    seen = load.ok["swap"]
    _wait(lambda: load.ok["swap"] > seen + 20)
    # Every answer under load came from one of the two files.
    assert load.swap_outputs == {before, *after}

    slow.join(60)
    assert "error" not in slow_result, slow_result
    assert np.asarray(slow_result["y"]).shape == (256, 1024)
    _wait(lambda: "gone" not in registry.names())


def reload_batching_on_then_nothing(server: ServerThread, repo: Path, load: Load) -> None:
    """Settings of `swap` change (batching on) and it swaps again; then a reload with
    nothing changed touches nothing."""
    assert server.server is not None
    (repo / "swap" / "model.toml").write_text(
        "max_batch_size = 16\ninstance_count = 1\n"
        "[dynamic_batching]\nmax_queue_delay_microseconds = 500\n"
    )
    again = server.call(server.server.reload())
    assert again.ok and again.models is not None
    assert again.models.changed == ["swap v1"] and again.models.unchanged == 2
    assert server.server.registry.get("swap").batcher is not None
    seen = load.ok["swap"]
    _wait(lambda: load.ok["swap"] > seen + 20)

    quiet = server.call(server.server.reload())
    assert quiet.models is not None and quiet.models.unchanged == 3
    assert quiet.models.changed == quiet.models.added == quiet.models.removed == []


def assert_new_served_and_gone(target: str) -> None:
    """`new` answers and is SERVING; `gone` is NOT_FOUND, and NOT_SERVING in health."""
    with Client(target, timeout=10, retries=0) as client:
        y = client.predict("new", {"x": np.array([[1, 2, 3, 4]], np.int32)})["y"]
        assert y.tolist() == [[1, 2, 3, 4]]
        with pytest.raises(grpc.RpcError) as gone:
            client.predict("gone", {"x": np.zeros((1, 1024), np.float32)})
        assert gone.value.code() is grpc.StatusCode.NOT_FOUND
        assert [m.name for m in client.health().models] == ["mlp", "new", "swap"]
    with grpc.insecure_channel(target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        answer = check(health_pb2.HealthCheckRequest(service="tensord.model.gone"), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        answer = check(health_pb2.HealthCheckRequest(service="tensord.model.new"), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_reload_under_load_adds_changes_and_removes_without_failures(
    server: ServerThread, repo: Path
) -> None:
    load = Load(server.target).start()
    try:
        reload_under_load(server, repo, load)
        reload_batching_on_then_nothing(server, repo, load)
    finally:
        load.finish()
    assert load.errors == []
    assert load.ok["mlp"] > 20 and load.ok["swap"] > 80
    assert_new_served_and_gone(server.target)


def test_a_changed_model_that_fails_to_load_keeps_the_old_one(
    server: ServerThread, repo: Path
) -> None:
    assert server.server is not None
    (repo / "swap" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    result = server.call(server.server.reload())
    assert not result.ok and result.models is not None
    assert result.models.failed == ["swap v1"] and result.models.changed == []
    assert server.server.registry.get("swap").state is ModelState.READY
    with Client(server.target, timeout=10, retries=0) as client:
        before = client.predict("swap", {"x": SWAP_X})["y"]
    # Fixed on disk: the next reload takes it.
    _replace_file(_build_double, repo / "swap" / "1" / "model.onnx")
    (repo / "swap" / "model.toml").write_text("max_batch_size = 8\n")
    fixed = server.call(server.server.reload())
    assert fixed.ok and fixed.models is not None and fixed.models.changed == ["swap v1"]
    with Client(server.target, timeout=10, retries=0) as client:
        assert before.shape == (16, 512)
        assert client.predict("swap", {"x": X})["y"].tolist() == (2 * X).tolist()


def test_a_failed_model_is_retried_and_a_missing_repository_changes_nothing(
    server: ServerThread, repo: Path, tmp_path: Path
) -> None:
    assert server.server is not None
    broken = repo / "broken" / "1" / "model.onnx"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"garbage")
    first = server.call(server.server.reload())
    assert first.models is not None and first.models.failed == ["broken v1"]
    assert server.server.registry.get_versions("broken")[0].state is ModelState.FAILED
    build_identity(broken, TensorProto.FLOAT)
    second = server.call(server.server.reload())
    assert second.ok and second.models is not None and second.models.changed == ["broken v1"]
    assert server.server.registry.get("broken").state is ModelState.READY

    moved = tmp_path / "elsewhere"
    repo.rename(moved)
    third = server.call(server.server.reload())
    assert "is not a directory" in third.models_error
    assert server.server.registry.names() == ["broken", "gone", "mlp", "swap"]
    moved.rename(repo)


def test_a_model_toml_that_no_longer_reads_keeps_every_served_version(
    server: ServerThread, repo: Path
) -> None:
    assert server.server is not None
    registry = server.server.registry
    shutil.copytree(repo / "mlp" / "1", repo / "mlp" / "2")
    build_identity(repo / "ident_dir" / "1" / "model.onnx", TensorProto.INT32)
    (repo / "ident_dir" / "model.toml").write_text('name = "ident"\n')
    first = server.call(server.server.reload())
    assert first.ok and first.models is not None
    assert first.models.added == ["ident v1", "mlp v2"]
    mlp_toml = (repo / "mlp" / "model.toml").read_bytes()

    # Three ways for model.toml to stop reading: not UTF-8, not TOML, not a file.
    (repo / "mlp" / "model.toml").write_bytes(mlp_toml + b"# caf\xe9\n")
    (repo / "ident_dir" / "model.toml").write_text("name = [\n")
    (repo / "swap" / "model.toml").unlink()
    (repo / "swap" / "model.toml").mkdir()
    result = server.call(server.server.reload())
    assert not result.ok and result.models is not None
    assert sorted(result.models.failed) == ["ident v1", "mlp v1", "mlp v2", "swap v1"]
    assert result.models.removed == result.models.added == result.models.changed == []
    assert {(mv.name, mv.version, mv.state) for mv in registry.versions()} == {
        ("gone", 1, ModelState.READY),
        ("ident", 1, ModelState.READY),
        ("mlp", 1, ModelState.READY),
        ("mlp", 2, ModelState.READY),
        ("swap", 1, ModelState.READY),
    }
    with Client(server.target, timeout=10, retries=0) as client:
        x = np.full((1, 512), 0.25, np.float32)
        assert client.predict("mlp", {"input": x}, version=2)["output"].shape[0] == 1
        y = client.predict("ident", {"x": np.array([[7, 8, 9, 10]], np.int32)})["y"]
        assert y.tolist() == [[7, 8, 9, 10]]

    # Repaired: nothing to load again (the files and settings are those served).
    (repo / "mlp" / "model.toml").write_bytes(mlp_toml)
    (repo / "ident_dir" / "model.toml").write_text('name = "ident"\n')
    (repo / "swap" / "model.toml").rmdir()
    (repo / "swap" / "model.toml").write_text("max_batch_size = 16\ninstance_count = 1\n")
    fixed = server.call(server.server.reload())
    assert fixed.ok and fixed.models is not None
    assert fixed.models.unchanged == 5 and fixed.models.failed == []


def test_start_up_fails_only_unusable_directories(demo_repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(demo_repo / "mlp", root / "mlp")
    shutil.copytree(demo_repo / "mlp", root / "mlp_copy")
    (root / "mlp_copy" / "model.toml").write_text('name = "mlp"\nmax_batch_size = 64\n')
    shutil.copytree(demo_repo / "mlp", root / "latin1")
    (root / "latin1" / "model.toml").write_bytes(b"max_batch_size = 64 # caf\xe9\n")
    build_identity(root / "ident" / "1" / "model.onnx", TensorProto.INT32)
    build_identity(root / "ident" / "01" / "model.onnx", TensorProto.INT32)
    build_identity(root / "ident" / "0" / "model.onnx", TensorProto.INT32)
    build_identity(root / "ident" / "2" / "model.onnx", TensorProto.INT32)
    config = load_config(
        None, env={}, overrides={"model_repository": str(root), "server.listen": "127.0.0.1:0"}
    )
    srv = ServerThread(config).start()
    try:
        assert srv.server is not None
        registry = srv.server.registry
        states = {(mv.name, mv.version): mv for mv in registry.versions()}
        assert {k: mv.state for k, mv in states.items()} == {
            ("ident", 0): ModelState.FAILED,
            ("ident", 1): ModelState.FAILED,
            ("ident", 2): ModelState.READY,
            ("latin1", 1): ModelState.FAILED,
            ("mlp", 1): ModelState.FAILED,
        }
        assert states[("mlp", 1)].reason == (
            f"model name 'mlp' is claimed by 2 directories: {root}/mlp and {root}/mlp_copy; "
            "give each its own name (name = ... in model.toml)"
        )
        assert "not UTF-8 text" in states[("latin1", 1)].reason
        assert states[("ident", 1)].reason.endswith(
            "01/ and 1/ are both version 1; keep one of them"
        )
        assert "versions are numbered from 1" in states[("ident", 0)].reason
        with Client(srv.target, timeout=10, retries=0) as client:
            y = client.predict("ident", {"x": np.array([[1, 2, 3, 4]], np.int32)})["y"]
            assert y.tolist() == [[1, 2, 3, 4]]
        # Nothing swaps between reloads: the same entries stay failed.
        again = srv.call(srv.server.reload())
        assert again.models is not None and again.models.changed == []
        assert sorted(again.models.failed) == ["ident v0", "ident v1", "latin1 v1", "mlp v1"]
        assert registry.get("ident").version == 2
    finally:
        srv.stop()
