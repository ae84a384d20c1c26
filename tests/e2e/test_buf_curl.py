"""A person with no .proto at hand: `buf curl` over reflection, JSON typed by hand."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import onnxruntime as ort
import pytest

from tests.e2e.conftest import Daemon
from tests.tools import buf

pytestmark = pytest.mark.e2e


def buf_curl(daemon: Daemon, method: str, body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(buf()), "curl", "--protocol", "grpc", "--http2-prior-knowledge",
         f"http://{daemon.target}/tensord.v1.InferenceService/{method}", "-d", body],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_predict_with_a_hand_written_json_tensor(daemon: Daemon, demo_repo) -> None:  # type: ignore[no-untyped-def]
    values = [round(0.01 * i - 2.5, 2) for i in range(512)]
    body = json.dumps({
        "model": "mlp",
        "inputs": [{"name": "input", "dtype": "DATA_TYPE_FLOAT32", "shape": [1, 512],
                    "contents": {"float_values": values}}],
        "output_encoding": "TENSOR_ENCODING_CONTENTS",
    })  # fmt: skip
    result = buf_curl(daemon, "Predict", body)
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    (output,) = reply["outputs"]
    assert (output["name"], output["dtype"], output["shape"]) == (
        "output",
        "DATA_TYPE_FLOAT32",
        ["1", "10"],
    )
    session = ort.InferenceSession(str(demo_repo / "mlp" / "1" / "model.onnx"))
    (expected,) = session.run(None, {"input": np.array([values], dtype=np.float32)})
    np.testing.assert_allclose(
        np.array(output["contents"]["floatValues"], np.float32), expected[0], rtol=1e-5
    )


def test_errors_reach_the_person(daemon: Daemon) -> None:
    result = buf_curl(daemon, "Predict", '{"model": "mlp", "inputs": []}')
    assert result.returncode != 0
    error = json.loads(result.stdout or result.stderr)
    assert error["code"] == "invalid_argument"
    assert (
        error["message"] == "model 'mlp' is missing input(s) 'input' (DATA_TYPE_FLOAT32 [-1, 512])"
    )
