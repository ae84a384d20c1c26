"""The contract from another language: the Node client, built from the .proto at run time,
against the daemon; its outputs equal in-process ONNX Runtime bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tensord.backends.onnxruntime import session_options
from tensord.modelconfig.model import ModelConfig
from tests.e2e.conftest import Daemon, start_daemon
from tests.models import IDENTITY_DTYPES, _save, build_identity
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


# ---------------------------------------------------------------------------------------
# Input values are checked against the dtype: nothing is wrapped, truncated or rounded.

COLON_INPUT, COLON_OUTPUT = "input_1:0", "out:0"


@pytest.fixture(scope="module")
def dtype_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Identity models per integer/bool/float dtype, and one with tf2onnx-style ':' names."""
    root = tmp_path_factory.mktemp("node-dtypes")
    for dtype in ("bool", "uint8", "int8", "int32", "int64", "float32"):
        build_identity(root / f"identity_{dtype}" / "1" / "model.onnx", IDENTITY_DTYPES[dtype])
    graph = helper.make_graph(
        [helper.make_node("Identity", [COLON_INPUT], [COLON_OUTPUT])],
        "colon",
        [helper.make_tensor_value_info(COLON_INPUT, TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info(COLON_OUTPUT, TensorProto.FLOAT, ["batch", 4])],
    )
    _save(graph, root / "colon" / "1" / "model.onnx")
    d = start_daemon(root, tmp_path_factory.mktemp("node-dtypes-log") / "tensord.log")
    yield d
    if d.process.poll() is None:
        d.process.kill()
        d.process.wait(10)


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
@pytest.mark.parametrize(
    ("dtype", "row", "shown", "why"),
    [
        (
            "uint8",
            "[300, 1, 2, 3]",
            "300 at [0,0]",
            "out of range: uint8 takes integers from 0 to 255",
        ),
        ("uint8", "[1, -1, 2, 3]", "-1 at [0,1]", "out of range: uint8"),
        ("uint8", "[1, 2, 1.7, 3]", "1.7 at [0,2]", "not an integer: uint8"),
        (
            "int8",
            "[0, 0, 0, 128]",
            "128 at [0,3]",
            "out of range: int8 takes integers from -128 to 127",
        ),
        ("int32", "[3000000000, 0, 0, 0]", "3000000000 at [0,0]", "out of range: int32"),
        ("int32", '[0, "abc", 0, 0]', '"abc" at [0,1]', "not an integer: int32"),
        ("int32", "[0, 0, true, 0]", "true at [0,2]", "not an integer: int32"),
        ("int64", "[1.5, 0, 0, 0]", "1.5 at [0,0]", "not an integer: int64"),
        ("int64", "[0, 9223372036854775808, 0, 0]", "9223372036854775808 at [0,1]", "out of range"),
        (
            "int64",
            "[0, 0, 1.2345678901234567e17, 0]",
            "123456789012345660 at [0,2]",
            "as a JSON string",
        ),
        ("float32", '["abc", 0, 0, 0]', '"abc" at [0,0]', "not a number: float32"),
        ("float32", "[0, true, 0, 0]", "true at [0,1]", "not a number: float32"),
        ("float32", "[0, 0, null, 0]", "null at [0,2]", "not a number: float32"),
        ("float32", "[0, 0, 0, 1e39]", "1e+39 at [0,3]", "out of range: float32"),
        ("bool", "[true, 2, false, true]", "2 at [0,1]", "not a bool"),
    ],
)
def test_a_value_the_dtype_cannot_hold_is_a_usage_error(
    node: Path,
    dtype_daemon: Daemon,
    tmp_path: Path,
    typed: bool,
    dtype: str,
    row: str,
    shown: str,
    why: str,
) -> None:
    flags = ["--typed"] if typed else []
    args = ["predict", f"identity_{dtype}", "--input", f"x:{dtype}=[{row}]", *flags]
    result = run_client(node, dtype_daemon.target, tmp_path, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith(f"usage error: --input x: {shown} "), result.stderr
    assert why in result.stderr
    assert "Error" not in result.stderr  # no stack trace


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
@pytest.mark.parametrize(
    ("dtype", "row", "expected"),
    [
        ("uint8", "[0, 255, 1, 7]", [0, 255, 1, 7]),
        ("int8", '[-128, 127, "-5", 0]', [-128, 127, -5, 0]),
        ("int32", "[-2147483648, 2147483647, 1e3, -0]", [-2147483648, 2147483647, 1000, 0]),
        (
            "int64",
            '[9007199254740993, "-9223372036854775808", 9223372036854775807, -9007199254740993]',
            [
                "9007199254740993",
                "-9223372036854775808",
                "9223372036854775807",
                "-9007199254740993",
            ],
        ),
        ("bool", "[true, false, 1, 0]", [True, False, True, False]),
        ("float32", '[1.5, "NaN", "-0", "-Infinity"]', [1.5, "NaN", "-0", "-Infinity"]),
    ],
)
def test_values_at_the_dtype_limits_round_trip_exactly(
    node: Path,
    dtype_daemon: Daemon,
    tmp_path: Path,
    typed: bool,
    dtype: str,
    row: str,
    expected: list[object],
) -> None:
    flags = ["--typed"] if typed else []
    args = ["predict", f"identity_{dtype}", "--input", f"x:{dtype}=[{row}]", *flags]
    result = run_client(node, dtype_daemon.target, tmp_path, *args)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)["outputs"]["y"]
    assert (output["dtype"], output["shape"]) == (f"DATA_TYPE_{dtype.upper()}", [1, 4])
    assert output["values"] == expected


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
@pytest.mark.parametrize("suffix", ["", ":float32", ":DATA_TYPE_FLOAT32"])
def test_input_names_may_hold_colons(
    node: Path, dtype_daemon: Daemon, tmp_path: Path, typed: bool, suffix: str
) -> None:
    flags = ["--typed"] if typed else []
    spec = f"{COLON_INPUT}{suffix}=[[1, 2.5, -3, 4]]"
    result = run_client(
        node, dtype_daemon.target, tmp_path, "predict", "colon", "--input", spec, *flags
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)["outputs"][COLON_OUTPUT]
    assert (output["dtype"], output["values"]) == ("DATA_TYPE_FLOAT32", [1, 2.5, -3, 4])


# ---------------------------------------------------------------------------------------
# Generate: a stream of token chunks, from the command line and as an async iterator.


@pytest.fixture(scope="module")
def gen_daemon(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon over the demo repository (tinylm) for the Generate tests."""
    d = start_daemon(demo_repo, tmp_path_factory.mktemp("node-generate") / "tensord.log")
    yield d
    if d.process.poll() is None:
        d.process.kill()
        d.process.wait(10)


def python_tokens(target: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens for the same request, through the Python client."""
    from tensord_client import Client

    with Client(target, timeout=60) as client:
        chunks = client.generate(
            "tinylm", token_ids=prompt_ids, max_tokens=max_tokens, temperature=0, ignore_eos=True
        )
        return [t for chunk in chunks for t in chunk.token_ids]


def test_generate_streams_chunks_as_json_lines(
    node: Path, gen_daemon: Daemon, tmp_path: Path
) -> None:
    args = ["generate", "tinylm", "--token-ids", "5,6,7", "--max-tokens", "12",
            "--temperature", "0", "--ignore-eos", "--request-id", "node-gen-1"]  # fmt: skip
    result = run_client(node, gen_daemon.target, tmp_path, *args)
    assert result.returncode == 0, result.stderr
    chunks = [json.loads(line) for line in result.stdout.splitlines()]
    tokens = [t for c in chunks for t in c["token_ids"]]
    assert tokens == python_tokens(gen_daemon.target, [5, 6, 7], 12)
    assert [c["index"] for c in chunks] == [
        sum(len(c["token_ids"]) for c in chunks[:i]) for i in range(len(chunks))
    ]
    assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["LENGTH"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert chunks[-1]["usage"]["prompt_tokens"] == 3


def test_generate_errors_and_usage_mistakes(node: Path, gen_daemon: Daemon, tmp_path: Path) -> None:
    result = run_client(node, gen_daemon.target, tmp_path, "generate", "mlp", "hello")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("ERROR FAILED_PRECONDITION: "), result.stderr
    for args, message in (
        (["generate", "tinylm"], "a PROMPT or --token-ids"),
        (["generate", "tinylm", "--token-ids", "1,,2"], "expected comma-separated integers"),
        (
            ["generate", "tinylm", "hi", "--max-tokens", "2.5"],
            "--max-tokens 2.5: expected an integer",
        ),
    ):
        result = run_client(node, gen_daemon.target, tmp_path, *args)
        assert result.returncode == 2 and result.stderr.startswith("usage error: "), result
        assert message in result.stderr


def test_generate_as_an_async_iterator(node: Path, gen_daemon: Daemon, tmp_path: Path) -> None:
    """The library: chunks with `for await`; leaving the loop early cancels the call (the
    server frees the sequence); a failed call rejects; a misspelt field throws at once."""
    program = f"""
const tensord = require({json.dumps(str(SCRIPT))});
const grpc = require({json.dumps(str(CLIENT_DIR / "node_modules" / "@grpc" / "grpc-js"))});
(async () => {{
  const Service = tensord.loadService();
  const client = new Service({json.dumps(gen_daemon.target)}, grpc.credentials.createInsecure());
  const out = {{}};
  const greedy = {{ token_ids: [5, 6, 7], max_tokens: 12, temperature: 0, ignore_eos: true }};
  out.tokens = [];
  for await (const chunk of tensord.generate(client, 'tinylm', greedy)) {{
    out.tokens.push(...chunk.token_ids);
    out.last = chunk.finish_reason;
  }}
  out.early = 0;
  const long = {{ token_ids: [5, 6], max_tokens: 2000, ignore_eos: true }};
  for await (const chunk of tensord.generate(client, 'tinylm', long)) {{
    out.early += chunk.token_ids.length;
    break;
  }}
  try {{
    for await (const chunk of tensord.generate(client, 'mlp', {{ prompt: 'x' }})) {{}}
  }} catch (err) {{
    out.error = [grpc.status[err.code], err.details.includes('not a generator')];
  }}
  try {{
    tensord.generate(client, 'tinylm', {{ prompt: 'x', max_token: 3 }});
  }} catch (err) {{
    out.usage = [err instanceof tensord.UsageError, err.message.split(';')[0]];
  }}
  client.close();
  console.log(JSON.stringify(out));
}})();
"""
    result = subprocess.run(
        [str(node), "-e", program], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["tokens"] == python_tokens(gen_daemon.target, [5, 6, 7], 12)
    assert out["last"] == "LENGTH"
    assert 1 <= out["early"] < 2000
    assert out["error"] == ["FAILED_PRECONDITION", True]
    assert out["usage"] == [True, "unknown sampling field(s) max_token"]
    from tensord_client import Client
    from tests.conftest import wait_generator_idle

    with Client(gen_daemon.target) as client:  # the early break freed the sequence
        status = wait_generator_idle(client, "tinylm")
    assert (status.running, status.waiting, status.kv_cache.used_blocks) == (0, 0, 0)


def test_the_target_comes_from_tensord_target(
    node: Path, gen_daemon: Daemon, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(node), str(SCRIPT), "health", "tinylm"],
        cwd=tmp_path,
        env={**os.environ, "TENSORD_TARGET": gen_daemon.target},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["models"][0]["state"] == "MODEL_STATE_READY"
