"""Shared fixtures: model repositories built locally, and real servers on loopback port 0.

Nothing of the serving stack is imported until a fixture or helper needs it, so the GPU
tier's kernel tests run where only NumPy, cuda-bindings and NVRTC are installed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tensord.config import TensordConfig
    from tensord.server.app import TensordServer
    from tensord.v1 import inference_pb2 as pb
    from tensord_client import Client
    from tests.hf_families import ExportCache


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo repository (mlp, cnn), built once per session."""
    from tensord.demo.repository import build_demo_repository

    root = tmp_path_factory.mktemp("demo-models")
    build_demo_repository(root)
    return root


@pytest.fixture(scope="session")
def hf_exports(tmp_path_factory: pytest.TempPathFactory) -> ExportCache:
    """Tiny Hugging Face models of many families exported with Optimum, each once per
    session on first use (the export extra: torch, transformers, optimum-onnx)."""
    from tests.hf_families import ExportCache
    from tests.tools import require_module

    for module in ("torch", "transformers", "optimum.exporters.onnx"):
        require_module(module, "make setup (the export extra)")
    return ExportCache(tmp_path_factory.mktemp("hf-exports"))


@pytest.fixture(scope="session")
def test_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Demo models plus identity, slow, two-output, versioned and corrupt models."""
    from tests.models import build_test_repository

    return build_test_repository(tmp_path_factory.mktemp("test-models"))


class ServerThread:
    """A real TensordServer on 127.0.0.1:0, running its own event loop on a thread."""

    def __init__(self, config: TensordConfig, **options: Any) -> None:
        self.config = config
        self.options = options
        """Keyword arguments for TensordServer (backend_factory, config_loader)."""
        self.loop = asyncio.new_event_loop()
        self.server: TensordServer | None = None
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="tensord-test-server", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            from tensord.server.app import TensordServer

            self.server = TensordServer(self.config, **self.options)
            self.port = await self.server.start()

        try:
            self.loop.run_until_complete(start())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
            self._close_loop()
            return
        self._ready.set()
        self.loop.run_forever()
        self._close_loop()

    def _close_loop(self) -> None:
        """Join the loop's worker threads (asyncio.to_thread) and close it: nothing of a
        stopped server stays behind."""
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(60):
            raise TimeoutError("the test server did not start within 60 s")
        if self._error is not None:
            raise self._error
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, coro):  # type: ignore[no-untyped-def]
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def stop(self, grace: float = 5.0) -> None:
        assert self.server is not None
        self.call(self.server.stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the test server's thread did not end"


FRONTENDS = int(os.environ.get("TENSORD_TEST_FRONTENDS") or 0)
"""The frontends tier (`make test` runs it): with N > 0, `serve` and `start_server` start
`tensord serve` with `[server] frontends = N` as a subprocess, and the tests marked
`in_process` (they reach into the server object) are left to the in-process run."""


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def config_toml(overrides: dict[str, object]) -> str:
    """A config file holding these dotted-key settings."""
    tables: dict[str, dict[str, object]] = {}
    for key, value in overrides.items():
        table, _, name = key.rpartition(".")
        tables.setdefault(table, {})[name] = value
    lines = [f"{name} = {_toml_value(v)}" for name, v in tables.pop("", {}).items()]
    for table, items in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{name} = {_toml_value(v)}" for name, v in items.items()]
    return "\n".join(lines) + "\n"


class DaemonProcesses:
    """`tensord serve` with `[server] frontends = N`, as systemd runs it: the supervisor, an
    engine and N frontends. It offers what the tests use of a ServerThread from outside
    (`target`, `port`, `stop`); `server` is None (the server objects live in the children)."""

    server = None

    def __init__(self, overrides: dict[str, object], frontends: int) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="tensord-frontends-"))
        config = self.directory / "tensord.toml"
        settings = {**overrides, "server.frontends": frontends, "server.log_format": "json"}
        config.write_text(config_toml(settings))
        self.log_path = self.directory / "tensord.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tensord.cli", "serve", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.port = 0

    def start(self) -> DaemonProcesses:
        deadline = time.monotonic() + 90
        while True:
            events = [json.loads(line) for line in self.log_path.read_text().splitlines(True)
                      if line.startswith("{") and line.endswith("\n")]  # fmt: skip
            for event in events:
                if event.get("event") == "supervisor.starting":
                    self.port = int(event["listen"].rsplit(":", 1)[1])
            if any(e.get("event") == "supervisor.ready" for e in events):
                return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the daemon did not start:\n{self.log_path.read_text()}")
            time.sleep(0.05)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, grace: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace + 30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _server(overrides: dict[str, object]) -> Any:
    """A ServerThread with these settings, or in the frontends tier DaemonProcesses."""
    if FRONTENDS:
        return DaemonProcesses(overrides, FRONTENDS).start()
    from tensord.config import load_config

    return ServerThread(load_config(None, env={}, overrides=overrides)).start()


def start_server(repo: Path, **server: object) -> ServerThread:
    """Start a server on a free loopback port over `repo` with [server] overrides."""
    overrides: dict[str, object] = {"model_repository": str(repo), "server.listen": "127.0.0.1:0"}
    overrides.update({f"server.{k}": v for k, v in server.items()})
    return _server(overrides)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def server(test_repo: Path) -> Iterator[ServerThread]:
    """One in-process server over the test repository, shared by the grpc tests."""
    srv = start_server(test_repo, max_receive_message_bytes=4 * 1024 * 1024)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server: ServerThread):  # type: ignore[no-untyped-def]
    """A sync client of the shared server."""
    from tensord_client import Client

    with Client(server.target, timeout=30, retries=0) as c:
        yield c


@pytest.fixture(scope="session")
def small_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp and cnn, and mlp_batched (dynamic batching on): cheap to load for many servers."""
    import shutil

    from tensord.demo.repository import build_demo_repository

    root = tmp_path_factory.mktemp("small-models")
    build_demo_repository(root)
    for extra in ("classifier", "tinylm"):
        shutil.rmtree(root / extra)
    batched = root / "mlp_batched"
    (batched / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "mlp" / "1" / "model.onnx", batched / "1" / "model.onnx")
    (batched / "model.toml").write_text(
        "max_batch_size = 32\n[dynamic_batching]\nmax_queue_delay_microseconds = 2000\n"
    )
    return root


def serve(repo: Path, **settings: object) -> ServerThread:
    """A server on a free loopback port over `repo`; settings are dotted keys with `__` for
    the dot (`tls__cert_file=...`, `server__max_connection_age_seconds=1`)."""
    overrides: dict[str, object] = {"model_repository": str(repo), "server.listen": "127.0.0.1:0"}
    overrides.update({k.replace("__", "."): v for k, v in settings.items()})
    return _server(overrides)  # type: ignore[no-any-return]


def wait_generator_idle(client: Client, model: str, timeout: float = 5.0) -> pb.GeneratorStatus:
    """A generator's status once no sequence runs, waits or holds a KV block (aborts land
    within a step), or as it is when `timeout` seconds have passed."""
    end = time.monotonic() + timeout
    while True:
        (info,) = [m for m in client.info().models if m.name == model]
        status = info.generator
        idle = (status.running, status.waiting, status.kv_cache.used_blocks) == (0, 0, 0)
        if idle or time.monotonic() > end:
            return status
        time.sleep(0.02)
