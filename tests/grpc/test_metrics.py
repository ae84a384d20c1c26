"""Prometheus metrics scraped from a real endpoint after real traffic, checked by promtool."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tensord import __version__
from tensord.observability.metrics import Metrics
from tensord_client import Client
from tests.conftest import ServerThread, serve
from tests.tools import promtool

X = np.zeros((1, 512), np.float32)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        return str(reply.read().decode())


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


@pytest.fixture(scope="module")
def metrics_repo(
    small_repo: Path, demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The small repository plus the demo generator with a 64-block KV pool."""
    root = tmp_path_factory.mktemp("metrics-models")
    shutil.copytree(small_repo, root, dirs_exist_ok=True)
    shutil.copytree(demo_repo / "tinylm", root / "tinylm")
    (root / "tinylm" / "model.toml").write_text("[generator]\nnum_blocks = 64\nblock_size = 32\n")
    return root


@pytest.fixture(scope="module")
def metrics_server(metrics_repo: Path) -> Iterator[ServerThread]:
    srv = serve(metrics_repo, metrics__listen="127.0.0.1:0")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def scraped(metrics_server: ServerThread) -> str:
    """The endpoint's text after a known mix of calls."""
    with Client(metrics_server.target, timeout=30, retries=0) as client:
        for _ in range(5):
            client.predict("mlp", {"input": X})
        with ThreadPoolExecutor(8) as pool:  # concurrent calls for the batcher to join
            list(pool.map(lambda _: client.predict("mlp_batched", {"input": X}), range(8)))
        for model, inputs in (("nope", {"input": X}), ("mlp", {"wrong": X})):
            with pytest.raises(grpc.RpcError):
                client.predict(model, inputs)
        client.health()
        client.info()
        chunks = list(client.generate("tinylm", token_ids=[5, 6, 7], max_tokens=5, ignore_eos=True))
        assert sum(len(c.token_ids) for c in chunks) == 5
        # Refused by the engine (max_tokens beyond the context): its prompt never counts.
        with pytest.raises(grpc.RpcError):
            list(client.generate("tinylm", token_ids=[5] * 100, max_tokens=100_000))
    server = metrics_server.server
    assert server is not None and server.observability.generation is not None
    # The recorders, on a model of its own: 3 tokens, the first 0.5 s after the request
    # arrived, then 2 more 0.2 s later (the output processor's arithmetic is tested apart).
    stream = server.observability.generation.stream("mlp", prompt_tokens=7)
    stream.tokens(1)
    stream.tokens(2)
    timings = server.observability.generation.timings("mlp")
    timings.first_token(0.5)
    timings.inter_token(0.2 / 2, 2)
    return scrape(server.observability.port)


def test_requests_by_rpc_model_and_status(scraped: str) -> None:
    found = samples(scraped)
    total = "tensord_requests_total"
    assert value(found, total, rpc="Predict", model="mlp", code="OK") == 5
    assert value(found, total, rpc="Predict", model="mlp_batched", code="OK") == 8
    assert value(found, total, rpc="Predict", model="_unknown", code="NOT_FOUND") == 1
    assert value(found, total, rpc="Predict", model="mlp", code="INVALID_ARGUMENT") == 1
    assert value(found, total, rpc="Health", model="", code="OK") == 1
    assert value(found, total, rpc="Info", model="", code="OK") == 1
    duration = "tensord_request_duration_seconds_count"
    assert value(found, duration, rpc="Predict", model="mlp") == 6
    for stage in ("queue", "compute"):
        assert value(found, f"tensord_request_{stage}_seconds_count", model="mlp") == 5
        assert value(found, f"tensord_request_{stage}_seconds_count", model="mlp_batched") == 8
    bucket = "tensord_request_duration_seconds_bucket"
    assert value(found, bucket, rpc="Predict", model="mlp", le="+Inf") == 6


def test_batching_executor_and_model_state(scraped: str, metrics_server: ServerThread) -> None:
    found = samples(scraped)
    assert metrics_server.server is not None
    batcher = metrics_server.server.registry.get("mlp_batched").batcher
    assert batcher is not None
    labels = {"model": "mlp_batched", "version": "1"}
    assert value(found, "tensord_batch_size_count", **labels) == batcher.stats.batches
    assert value(found, "tensord_batch_size_sum", **labels) == 8  # one row per request
    assert value(found, "tensord_batch_size_bucket", le="+Inf", **labels) == batcher.stats.batches
    assert value(found, "tensord_batch_queue_depth", **labels) == 0
    mlp = {"model": "mlp", "version": "1"}
    assert value(found, "tensord_executor_runs_total", **mlp) == 5  # warm-up is not counted
    assert value(found, "tensord_executor_busy_seconds_total", **mlp) > 0
    assert value(found, "tensord_executor_queued_runs", **mlp) == 0
    assert value(found, "tensord_executor_running_runs", **mlp) == 0
    assert ("tensord_pool_high_water_bytes", frozenset({**mlp, "pool": "host"}.items())) in found
    assert value(found, "tensord_model_versions", state="ready") == 4
    assert value(found, "tensord_model_versions", state="failed") == 0
    assert value(found, "tensord_build_info", version=__version__) == 1
    assert value(found, "process_resident_memory_bytes") > 10e6


def test_generation_metrics(scraped: str) -> None:
    found = samples(scraped)
    assert value(found, "tensord_generated_tokens_total", model="mlp") == 3
    assert value(found, "tensord_prompt_tokens_total", model="mlp") == 7
    assert value(found, "tensord_time_to_first_token_seconds_sum", model="mlp") == 0.5
    # Two tokens 0.2 s after the first: two gaps of 0.1 s.
    assert value(found, "tensord_inter_token_latency_seconds_count", model="mlp") == 2
    assert value(found, "tensord_inter_token_latency_seconds_sum", model="mlp") == pytest.approx(
        0.2
    )
    assert value(found, "tensord_inter_token_latency_seconds_bucket", model="mlp", le="0.08") == 0
    assert value(found, "tensord_inter_token_latency_seconds_bucket", model="mlp", le="0.16") == 2
    # A real stream of 5 tokens from a 3-token prompt.
    assert value(found, "tensord_generated_tokens_total", model="tinylm") == 5
    assert value(found, "tensord_prompt_tokens_total", model="tinylm") == 3
    assert value(found, "tensord_time_to_first_token_seconds_count", model="tinylm") == 1
    assert value(found, "tensord_inter_token_latency_seconds_count", model="tinylm") == 4
    # The KV cache, read from the engine at scrape time: nothing held once the stream ended.
    tinylm = {"model": "tinylm", "version": "1"}
    assert value(found, "tensord_kv_blocks_used", **tinylm) == 0
    assert value(found, "tensord_kv_blocks_free", **tinylm) == 64
    assert value(found, "tensord_generate_sequences_running", **tinylm) == 0
    assert value(found, "tensord_generate_preemptions_total", **tinylm) == 0


def test_promtool_accepts_the_scrape(scraped: str) -> None:
    tool = promtool()
    checked = subprocess.run(
        [str(tool), "check", "metrics"], input=scraped, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == ""


def test_metrics_are_off_by_default(server: ServerThread) -> None:
    assert server.server is not None
    observability = server.server.observability
    assert observability.metrics is None and observability.observer is None
    assert observability.port == 0


def test_each_server_counts_its_own_calls() -> None:
    first, second = Metrics(), Metrics()
    first.requests.finished("Predict", "mlp", "OK", 0.01)
    assert (
        first.registry.get_sample_value(
            "tensord_requests_total", {"rpc": "Predict", "model": "mlp", "code": "OK"}
        )
        == 1
    )
    assert (
        second.registry.get_sample_value(
            "tensord_requests_total", {"rpc": "Predict", "model": "mlp", "code": "OK"}
        )
        is None
    )


def test_a_call_past_its_deadline_counts_as_deadline_exceeded(metrics_repo: Path) -> None:
    srv = serve(metrics_repo, metrics__listen="127.0.0.1:0")
    try:
        with Client(srv.target, retries=0) as client:
            for _ in range(3):  # whichever ends it, gRPC's deadline or the daemon's
                with pytest.raises(grpc.RpcError) as info:
                    list(
                        client.generate(
                            "tinylm", token_ids=[5, 6], max_tokens=1500, ignore_eos=True,
                            timeout=0.3,
                        )
                    )  # fmt: skip
                assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert srv.server is not None
        # The client hears its deadline first; the server records the call a moment later.
        end = time.monotonic() + 10
        while True:
            found = samples(scrape(srv.server.observability.port))
            codes = {
                dict(labels)["code"]: v
                for (name, labels), v in found.items()
                if name == "tensord_requests_total" and ("rpc", "Generate") in labels
            }
            if sum(codes.values()) >= 3 or time.monotonic() > end:
                break
            time.sleep(0.05)
        assert codes == {"DEADLINE_EXCEEDED": 3.0}
    finally:
        srv.stop()
