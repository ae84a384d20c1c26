"""The contract from another language: the Node client, built from the .proto at run time,
against the daemon; its outputs equal in-process ONNX Runtime bit for bit."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tensord.backends.onnxruntime import session_options
from tensord.registry.model_config import ModelConfig
from tests.e2e.conftest import Daemon
from tests.tools import ROOT, require_tool

pytestmark = pytest.mark.e2e

CLIENT_DIR = ROOT / "clients" / "node"
SCRIPT = CLIENT_DIR / "tensord-client.js"
INSTALL = "make npm-deps"
MASK32 = 0xFFFFFFFF


@pytest.fixture
def node() -> Path:
    """The node binary, with the client's packages installed; fails under CI=true if not."""
    found = shutil.which("node")
    path = require_tool(Path(found) if found else None, "node (Node.js 18+)", INSTALL)
    require_tool(CLIENT_DIR / "node_modules", "clients/node/node_modules", INSTALL)
    return path


def run_client(node: Path, target: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, from a directory other than its own (the .proto resolves from the script)."""
    return subprocess.run(
        [str(node), str(SCRIPT), "--target", target, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def mulberry32(seed: int) -> Iterator[int]:
    """The twin of the client's mulberry32: 32-bit unsigned outputs, bit for bit."""
    state = seed & MASK32
    while True:
        state = (state + 0x6D2B79F5) & MASK32
        t = state
        t = ((t ^ (t >> 15)) * (t | 1)) & MASK32
        t ^= (t + (((t ^ (t >> 7)) * (t | 61)) & MASK32)) & MASK32
        yield (t ^ (t >> 14)) & MASK32


def random_float32(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The client's `@random:SHAPE:SEED`: (u - 2^31) / 2^31 is exact, then rounds to float32."""
    draws = mulberry32(seed)
    count = int(np.prod(shape))
    exact = np.array([next(draws) for _ in range(count)], dtype=np.int64) - 2**31
    return (exact / 2.0**31).astype(np.float32).reshape(shape)


def printed_float32(values: list[float | str]) -> np.ndarray:
    """Printed numbers back to float32; -0, NaN and the infinities are printed as strings."""
    return np.array([float(v) for v in values], dtype=np.float64).astype(np.float32)


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    """The model in-process, with the daemon's session options."""
    session = ort.InferenceSession(
        str(model), session_options(ModelConfig()), providers=["CPUExecutionProvider"]
    )
    (output,) = session.run(None, {"input": x})
    return np.asarray(output)


def test_generator_twin_is_bit_identical(node: Path, tmp_path: Path) -> None:
    program = (
        f"const client = require({json.dumps(str(SCRIPT))});"
        "console.log(JSON.stringify(Array.from(client.randomFloat32(1000, 4294967295))));"
    )
    result = subprocess.run(
        [str(node), "-e", program], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    from_node = printed_float32(json.loads(result.stdout))
    from_python = random_float32((1000,), 4294967295)
    assert from_node.view(np.uint32).tolist() == from_python.view(np.uint32).tolist()
    assert from_python.min() >= -1.0 and from_python.max() < 1.0


def test_health_reports_serving(node: Path, daemon: Daemon, tmp_path: Path) -> None:
    result = run_client(node, daemon.target, tmp_path, "health")
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["status"] == "SERVING_STATUS_SERVING"
    assert {(m["name"], m["state"]) for m in reply["models"]} == {
        ("classifier", "MODEL_STATE_READY"),
        ("cnn", "MODEL_STATE_READY"),
        ("mlp", "MODEL_STATE_READY"),
        ("tinylm", "MODEL_STATE_READY"),
    }


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
def test_predict_matches_onnxruntime_bit_for_bit(
    node: Path, daemon: Daemon, demo_repo: Path, tmp_path: Path, typed: bool
) -> None:
    seed = 20240611
    flags = ["--typed"] if typed else []
    args = ["predict", "mlp", "--input", f"input=@random:3x512:{seed}", *flags]
    result = run_client(node, daemon.target, tmp_path, *args)
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert (reply["model"], reply["version"]) == ("mlp", 1)
    output = reply["outputs"]["output"]
    assert (output["dtype"], output["shape"]) == ("DATA_TYPE_FLOAT32", [3, 10])

    x = random_float32((3, 512), seed)
    expected = reference(demo_repo / "mlp" / "1" / "model.onnx", x)
    got = printed_float32(output["values"]).reshape(output["shape"])
    assert got.view(np.uint32).tolist() == expected.view(np.uint32).tolist()


def test_predict_with_a_literal_json_array(
    node: Path, daemon: Daemon, demo_repo: Path, tmp_path: Path
) -> None:
    rows = [[round(0.01 * i - 2.5, 2) for i in range(512)], [0.5] * 512]
    args = ["predict", "mlp", "--input", f"input={json.dumps(rows)}"]
    result = run_client(node, daemon.target, tmp_path, *args)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)["outputs"]["output"]
    expected = reference(demo_repo / "mlp" / "1" / "model.onnx", np.array(rows, np.float32))
    got = printed_float32(output["values"]).reshape(output["shape"])
    assert got.view(np.uint32).tolist() == expected.view(np.uint32).tolist()


def test_unknown_model_exits_1_with_not_found(node: Path, daemon: Daemon, tmp_path: Path) -> None:
    args = ["predict", "no-such-model", "--input", "input=@random:1x512:1"]
    result = run_client(node, daemon.target, tmp_path, *args)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("ERROR NOT_FOUND: "), result.stderr
    assert "no-such-model" in result.stderr


def test_request_id_is_echoed(node: Path, daemon: Daemon, tmp_path: Path) -> None:
    args = ["--request-id", "node-e2e-42", "predict", "mlp", "--input", "input=@random:1x512:5"]
    result = run_client(node, daemon.target, tmp_path, *args)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["request_id"] == "node-e2e-42"
