"""Dynamic batching through a real server: joined requests get exactly their own outputs."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tensord.backends.onnxruntime import session_options
from tensord.modelconfig.model import ModelConfig
from tensord_client import AsyncClient, Client
from tests.conftest import ServerThread


async def run_mixed(target: str, model: str, make_input, seed: int):  # type: ignore[no-untyped-def]
    """40 requests of 1-5 rows with staggered arrivals, 40 in flight at most."""
    rng = random.Random(seed)
    async with AsyncClient(target, retries=0) as client:

        async def one(i: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
            await asyncio.sleep(rng.random() * 0.05)
            inputs = make_input(np.random.default_rng(seed * 1000 + i), rng.randint(1, 5))
            return inputs, await client.predict(model, inputs)

        return await asyncio.gather(*(one(i) for i in range(40)))


def alone(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        str(path), session_options(ModelConfig()), providers=["CPUExecutionProvider"]
    )
    return session.run(None, inputs)


def mlp_input(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"input": rng.normal(size=(n, 512)).astype(np.float32)}


def cnn_input(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"image": rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)}


def batching_counts(server: ServerThread, model: str) -> tuple[int, int, int]:
    """(requests, batches, rows) the model's batcher has served, as Info shows them."""
    with Client(server.target, timeout=10, retries=0) as client:
        (status,) = [m for m in client.info().models if m.name == model]
    b = status.dynamic_batching
    return b.requests, b.batches, b.rows


async def test_mlp_batched_outputs_are_bit_exact(server: ServerThread, test_repo: Path) -> None:
    before = batching_counts(server, "mlp_batched")
    results = await run_mixed(server.target, "mlp_batched", mlp_input, seed=1)
    path = test_repo / "mlp_batched" / "1" / "model.onnx"
    for inputs, outputs in results:
        (expected,) = alone(path, inputs)
        assert outputs["output"].tobytes() == expected.tobytes()
    after = batching_counts(server, "mlp_batched")
    requests, batches = after[0] - before[0], after[1] - before[1]
    assert requests == 40
    assert batches < requests, "no two requests were ever joined"
    if server.server is not None:  # in one process: the batcher's own record of sizes
        batcher = server.server.registry.get("mlp_batched").batcher  # type: ignore[union-attr]
        assert batcher is not None and max(batcher.stats.batch_sizes) <= 32


async def test_cnn_batched_outputs_are_bit_exact(server: ServerThread, test_repo: Path) -> None:
    before = batching_counts(server, "cnn_batched")
    results = await run_mixed(server.target, "cnn_batched", cnn_input, seed=2)
    path = test_repo / "cnn_batched" / "1" / "model.onnx"
    for inputs, outputs in results:
        (expected,) = alone(path, inputs)
        assert outputs["probabilities"].tobytes() == expected.tobytes()
    after = batching_counts(server, "cnn_batched")
    requests = after[0] - before[0]
    assert requests == len(results)
    assert after[1] - before[1] < requests, "no two requests were ever joined"
