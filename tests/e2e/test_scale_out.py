"""Two daemons behind standard load balancing: gRPC's client-side round_robin over an ipv4:
target list, and nginx's grpc_pass. Both get traffic, and traffic keeps flowing when one is
stopped.

The daemons bind 127.0.0.1:0 for gRPC and for metrics and log the ports they got. nginx
cannot listen on port 0 ("invalid port"), so it listens on a unix socket of its own instead
of a port picked ahead, which another process could take first."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tensord_client import Client
from tests.e2e.conftest import LOOPBACK_ANY_PORT, Daemon, start_daemon
from tests.tools import nginx

pytestmark = pytest.mark.e2e
X = np.zeros((1, 512), np.float32)


@dataclass
class Instance:
    daemon: Daemon

    @property
    def port(self) -> int:
        return self.daemon.port

    @cached_property
    def metrics_port(self) -> int:
        """The port [metrics] listen = "127.0.0.1:0" got, from the "metrics.listening" line."""
        port = int(self.daemon.event("metrics.listening")["port"])
        assert port > 0, port
        return port

    def predicts(self) -> int:
        """Predicts this daemon answered OK, from its own /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        return int(
            sum(
                s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name == "tensord_requests_total"
                and s.labels == {"rpc": "Predict", "model": "mlp", "code": "OK"}
            )
        )


@pytest.fixture
def pair(demo_repo: Path, tmp_path: Path) -> Iterator[list[Instance]]:
    """Two daemons over the demo models, each with its metrics endpoint."""
    instances = []
    try:
        for name in ("a", "b"):
            config = tmp_path / f"{name}.toml"
            config.write_text(
                f'[metrics]\nlisten = "{LOOPBACK_ANY_PORT}"\n[server]\n'
                "drain_grace_seconds = 5.0\ndrain_delay_seconds = 1.0\n"
            )
            daemon = start_daemon(demo_repo, tmp_path / f"{name}.log", "--config", str(config))
            instances.append(Instance(daemon))
        yield instances
    finally:
        for instance in instances:
            if instance.daemon.process.poll() is None:
                instance.daemon.process.kill()
                instance.daemon.process.wait(10)


class Traffic:
    """Predicts in a loop on a thread until stopped; counts successes and failures."""

    def __init__(self, client: Client) -> None:
        self.ok = 0
        self.failures: list[str] = []
        self._client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 60  # bounded even if never stopped
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                self._client.predict("mlp", {"input": X})
                self.ok += 1
            except grpc.RpcError as exc:
                self.failures.append(f"{exc.code().name}: {exc.details()}")
            time.sleep(0.005)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def wait_for(self, ok: int, timeout: float = 30.0) -> None:
        """Until `ok` calls have succeeded in all (however slow the host is)."""
        deadline = time.monotonic() + timeout
        while self.ok < ok:
            assert time.monotonic() < deadline, (self.ok, self.failures[:5])
            time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def spread_then_stop_one(client: Client, pair: list[Instance]) -> None:
    """Both daemons serve a share; with one stopped mid-traffic, no call fails."""
    for _ in range(40):
        client.predict("mlp", {"input": X})
    first, second = pair[0].predicts(), pair[1].predicts()
    assert first + second == 40
    assert first >= 5 and second >= 5, (first, second)
    with Traffic(client) as traffic:
        traffic.wait_for(10)  # calls flow when the stop comes
        assert pair[0].daemon.terminate() == 0  # SIGTERM: drain, then exit
        before = pair[1].predicts()
        traffic.wait_for(traffic.ok + 10)  # and go on after it
    assert traffic.failures == []
    assert pair[1].predicts() > before  # the survivor took the traffic


def test_round_robin_over_an_ipv4_target_list(pair: list[Instance]) -> None:
    target = "ipv4:" + ",".join(f"127.0.0.1:{i.port}" for i in pair)
    with Client(target, timeout=10, round_robin=True) as client:
        spread_then_stop_one(client, pair)


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 128; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream tensord {{
        server 127.0.0.1:{a} max_fails=1 fail_timeout=10s;
        server 127.0.0.1:{b} max_fails=1 fail_timeout=10s;
        keepalive 8;
    }}
    server {{
        listen unix:{socket} http2;
        location / {{
            grpc_pass grpc://tensord;
            grpc_next_upstream error timeout;
        }}
    }}
}}
"""


def test_nginx_grpc_pass(pair: list[Instance], tmp_path: Path) -> None:
    binary = nginx()
    # A short directory of its own: unix socket paths are limited to 107 bytes.
    socket_dir = Path(tempfile.mkdtemp(prefix="tensord-nginx-"))
    socket = socket_dir / "grpc.sock"
    conf = tmp_path / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=tmp_path, a=pair[0].port, b=pair[1].port, socket=socket))
    checked = subprocess.run([str(binary), "-t", "-c", str(conf)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    proxy = subprocess.Popen(
        [str(binary), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        with Client(f"unix:{socket}", timeout=10) as client:
            deadline = time.monotonic() + 10
            while True:  # until nginx listens
                try:
                    client.health(timeout=1)
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, (tmp_path / "error.log").read_text()
                    time.sleep(0.1)
            spread_then_stop_one(client, pair)
    finally:
        proxy.terminate()
        proxy.wait(10)
        shutil.rmtree(socket_dir, ignore_errors=True)
