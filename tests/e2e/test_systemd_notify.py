"""The daemon as systemd runs it, with a real $NOTIFY_SOCKET: the messages it sends at
start, on the watchdog, around a reload (SIGHUP) and at drain (SIGTERM)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from tensord.server.notify import monotonic_usec
from tensord_client import Client
from tests.e2e.conftest import LOOPBACK_ANY_PORT, listening_port
from tests.models import build_identity
from tests.notify_socket import NotifyListener

pytestmark = pytest.mark.e2e


def serve(config: Path, listener: NotifyListener, log: Path, **env: str) -> subprocess.Popen[str]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tensord.cli", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=listener.env(PYTHONUNBUFFERED="1", **env),
        )


@pytest.fixture
def setup(demo_repo: Path, tmp_path: Path) -> Path:
    """A config whose daemon listens on 127.0.0.1:0: the port comes from its STATUS= line."""
    shutil.copytree(demo_repo, tmp_path / "models")
    config = tmp_path / "tensord.toml"
    config.write_text(
        f'model_repository = "models"\n[server]\nlisten = "{LOOPBACK_ANY_PORT}"\n'
        'log_format = "json"\n'
    )
    return config


def wait_started(listener: NotifyListener, log: Path, process: subprocess.Popen[str]) -> str:
    """The port from the first STATUS= line (the log names the same), then READY=1 with
    every model serving; returns the port."""
    first = listener.wait_for("STATUS", timeout=60)
    announced = re.fullmatch(r"loading models; listening on port ([1-9][0-9]*)", first["STATUS"])
    assert announced is not None and set(first) == {"STATUS"}, first
    port = announced[1]  # the port the kernel gave 127.0.0.1:0
    assert listening_port(log, process) == int(port)  # the log agrees
    ready = listener.wait_for("READY")
    assert ready == {"READY": "1", "STATUS": f"serving on port {port}: 4 ready"}
    with Client(f"127.0.0.1:{port}", timeout=10, retries=0) as client:  # READY means serving
        assert client.health().status == 1  # SERVING
    return port


def reload_a_new_model(
    process: subprocess.Popen[str], listener: NotifyListener, models: Path, port: str
) -> None:
    """A new model and SIGHUP: RELOADING=1 (with the monotonic time), then READY=1."""
    build_identity(models / "added" / "1" / "model.onnx", TensorProto.FLOAT)
    sent_at = monotonic_usec()
    process.send_signal(signal.SIGHUP)
    reloading = listener.wait_for("RELOADING")
    assert reloading["RELOADING"] == "1"
    assert sent_at <= int(reloading["MONOTONIC_USEC"]) <= monotonic_usec()
    assert reloading["STATUS"] == "reloading the configuration and the model repository"
    reloaded = listener.wait_for("READY")
    assert reloaded["STATUS"] == f"serving on port {port}: 5 ready"
    with Client(f"127.0.0.1:{port}", timeout=10, retries=0) as client:
        x = np.ones((1, 4), np.float32)
        assert client.predict("added", {"x": x})["y"].tolist() == x.tolist()


def reload_a_broken_config(
    process: subprocess.Popen[str], listener: NotifyListener, config: Path, port: str
) -> None:
    """A broken config on SIGHUP: the running one stays, the status says so."""
    good = config.read_text()
    config.write_text(good + "unknown_key = 1\n")
    process.send_signal(signal.SIGHUP)
    listener.wait_for("RELOADING")
    rejected = listener.wait_for("READY")
    assert rejected["STATUS"] == (
        f"serving on port {port}: 5 ready; the last reload had errors (see the log)"
    )
    with Client(f"127.0.0.1:{port}", timeout=10, retries=0) as client:
        assert client.health().status == 1


def test_ready_watchdog_reload_and_stopping(setup: Path, tmp_path: Path) -> None:
    config = setup
    listener = NotifyListener()
    process = serve(config, listener, tmp_path / "tensord.log", WATCHDOG_USEC="1000000")
    try:
        port = wait_started(listener, tmp_path / "tensord.log", process)

        # Keep-alives every 0.5 s, each after a Health call answered.
        pings = [m for m in listener.drain(2.2) if m == {"WATCHDOG": "1"}]
        assert 3 <= len(pings) <= 6

        reload_a_new_model(process, listener, tmp_path / "models", port)
        reload_a_broken_config(process, listener, config, port)

        process.send_signal(signal.SIGTERM)
        stopping = listener.wait_for("STOPPING")
        assert stopping["STATUS"] == "draining: in-flight calls get 30 s"
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        listener.close()
    log = (tmp_path / "tensord.log").read_text()
    assert '"event": "reload.config_rejected"' in log and "unknown_key" in log
    # Frozen at start-up and again after each of the two reloads.
    assert log.count('"event": "server.heap_frozen"') == 3
    # Nothing after STOPPING but possibly a last keep-alive sent before it.
    last = listener.messages.index(stopping)
    assert all(m == {"WATCHDOG": "1"} for m in listener.messages[last + 1 :])


def test_the_probe_directory_of_a_killed_daemon_goes_at_the_next_start(
    setup: Path, tmp_path: Path
) -> None:
    """SIGKILL leaves the watchdog's probe directory behind; the next daemon started there
    removes it (its own goes at its drain)."""
    temp = Path(tempfile.mkdtemp(prefix="wd-", dir="/tmp"))  # tmp_path is too long for it
    listener = NotifyListener()
    log = tmp_path / "tensord.log"
    first = serve(setup, listener, log, WATCHDOG_USEC="1000000", TMPDIR=str(temp))
    try:
        listener.wait_for("READY", timeout=60)
        assert [p.name.split("-")[2] for p in temp.glob("tensord-watchdog-*")] == [str(first.pid)]
        first.kill()
        first.wait(10)
        assert len(list(temp.glob("tensord-watchdog-*"))) == 1  # nothing could remove it
        second = serve(setup, listener, log, WATCHDOG_USEC="1000000", TMPDIR=str(temp))
        try:
            listener.wait_for("READY", timeout=60)
            assert [p.name.split("-")[2] for p in temp.glob("tensord-watchdog-*")] == [
                str(second.pid)
            ]
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0
            assert list(temp.glob("tensord-watchdog-*")) == []
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        if first.poll() is None:
            first.kill()
        listener.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_temporary_directory_too_long_for_a_socket_path_falls_back(
    setup: Path, tmp_path: Path
) -> None:
    """A TMPDIR whose probe socket path would pass 107 bytes: the probe goes under /tmp."""
    temp = tmp_path / ("t" * 80)
    temp.mkdir()
    listener = NotifyListener()
    process = serve(
        setup, listener, tmp_path / "tensord.log", WATCHDOG_USEC="1000000", TMPDIR=str(temp)
    )
    try:
        listener.wait_for("READY", timeout=60)
        assert [m for m in listener.drain(1.2) if m == {"WATCHDOG": "1"}]
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        listener.close()


def test_abstract_socket_and_no_watchdog(setup: Path, tmp_path: Path) -> None:
    config = setup
    listener = NotifyListener(abstract=True)
    process = serve(config, listener, tmp_path / "tensord.log")
    try:
        listener.wait_for("READY")
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        listener.wait_for("STOPPING")
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        listener.close()
    assert not any("WATCHDOG" in m for m in listener.messages)
    assert "watchdog" not in (tmp_path / "tensord.log").read_text()


def test_frontends_speak_to_systemd_through_the_supervisor(setup: Path, tmp_path: Path) -> None:
    """`frontends = 2`: only the supervisor talks to systemd (NotifyAccess=main); READY once
    every process is ready; keep-alives while every child reports (a frontend after each of
    its own Health probes), none while one hangs."""
    import os

    config = setup
    config.write_text(config.read_text() + "frontends = 2\n")
    listener = NotifyListener()
    log = tmp_path / "tensord.log"
    process = serve(config, listener, log, WATCHDOG_USEC="1000000")
    try:
        ready = listener.wait_for("READY", timeout=90)
        port = listening_port(log, process)
        assert ready == {
            "READY": "1",
            "STATUS": f"serving on port {port} with 2 frontends: 4 ready",
        }
        with Client(f"127.0.0.1:{port}", timeout=10, retries=0) as client:
            assert client.health().status == 1  # READY means serving
        pings = [m for m in listener.drain(2.2) if m == {"WATCHDOG": "1"}]
        assert 3 <= len(pings) <= 6
        frontend = next(
            int(e["pid"]) for e in map(__import__("json").loads, log.read_text().splitlines())
            if e.get("event") == "supervisor.started_child" and e.get("role") == "frontend"
        )  # fmt: skip
        os.kill(frontend, signal.SIGSTOP)  # a hung frontend: no more keep-alives
        try:
            time.sleep(1.2)
            listener.drain(0.1)
            assert not [m for m in listener.drain(1.5) if m == {"WATCHDOG": "1"}]
        finally:
            os.kill(frontend, signal.SIGCONT)
        assert [m for m in listener.drain(2.0) if m == {"WATCHDOG": "1"}]
        process.send_signal(signal.SIGHUP)
        assert listener.wait_for("RELOADING")["RELOADING"] == "1"
        assert listener.wait_for("READY")["STATUS"].endswith(": 4 ready")
        process.send_signal(signal.SIGTERM)
        assert listener.wait_for("STOPPING")["STATUS"] == "draining: in-flight calls get 30 s"
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        listener.close()
