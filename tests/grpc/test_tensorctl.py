"""`tensorctl` against a real server: files stay where they belong, errors are one line with
the right exit status, JSON is JSON, and TLS flags never fall back to plaintext."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tensord_client._common import generate_request
from tensord_client.cli import main
from tests.conftest import ServerThread, start_server


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Exit status, stdout (tensorctl's own lines: the in-process server logs there too,
    as lines that start with a timestamp) and stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    own = [line for line in out.splitlines() if not line.startswith("20")]
    return code, "\n".join(own), err


@pytest.fixture(scope="module")
def odd_names(tmp_path_factory: pytest.TempPathFactory) -> ServerThread:
    """A model whose output names are paths, and an input name holding '='."""
    root = tmp_path_factory.mktemp("odd-names")
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["in=put"], ["../../up"]),
            helper.make_node("Identity", ["in=put"], ["/abs/file"]),
        ],
        "odd",
        [helper.make_tensor_value_info("in=put", TensorProto.FLOAT, ["batch", 2])],
        [
            helper.make_tensor_value_info("../../up", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("/abs/file", TensorProto.FLOAT, ["batch", 2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / "odd" / "1").mkdir(parents=True)
    onnx.save(model, root / "odd" / "1" / "model.onnx")
    (root / "odd" / "model.toml").write_text("max_batch_size = 8\n")
    srv = start_server(root)
    yield srv
    srv.stop()


def test_output_files_stay_inside_the_output_dir(
    odd_names: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a" / "b" / "out"
    code, _, err = run(
        capsys,
        "-t",
        odd_names.target,
        "predict",
        "odd",
        "--input",
        "in=put=[[1, 2]]",
        "--output-dir",
        str(out),
    )
    assert code == 0, err
    written = sorted(tmp_path.rglob("*.npy"))
    assert written == sorted([out / "_abs_file.npy", out / "_.._.._up.npy"])
    assert np.load(out / "_.._.._up.npy").tolist() == [[1.0, 2.0]]


def test_outputs_round_trip_through_npy_files(
    server: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for dtype, values in (("string", '[["a", "bc", "", "é"]]'), ("bfloat16", "[[1.5, 2, 3, 4]]")):
        model = f"identity_{dtype}"
        first, second = tmp_path / f"{dtype}-1", tmp_path / f"{dtype}-2"
        code, _, err = run(
            capsys, "-t", server.target, "predict", model, "-i", f"x={values}", "--output-dir",
            str(first),
        )  # fmt: skip
        assert code == 0, err
        code, _, err = run(
            capsys, "-t", server.target, "predict", model, "-i", f"x={first / 'y.npy'}",
            "--output-dir", str(second),
        )  # fmt: skip
        assert code == 0, err
        assert (first / "y.npy").read_bytes() == (second / "y.npy").read_bytes()


def test_json_output_is_strict_json_with_non_finite_numbers(
    server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys,
        "-t",
        server.target,
        "--json",
        "predict",
        "identity_float32",
        "-i",
        "x=[[NaN, Infinity, -Infinity, 0.5]]",
    )
    assert code == 0

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    record = json.loads(out, parse_constant=refuse)
    assert record["y"]["values"] == [["NaN", "Infinity", "-Infinity", 0.5]]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("identity_uint8", "-i", "x=[[300, 1, 2, 3]]"), "cannot make uint8 of the JSON"),
        (("identity_int8", "-i", "x=[[1.5, 1, 2, 3]]"), "holds non-integer numbers"),
        (("identity_float32", "-i", 'x=[["a", 1, 2, 3]]'), "holds strings or mixed values"),
        (("identity_float32", "-i", "x=[[1, 2], [3]]"), "cannot make float32 of the JSON"),
        (("identity_float32", "-i", "x=/nonexistent/x.npy"), "cannot load '/nonexistent/x.npy'"),
        (("identity_float32", "-i", "x"), "--input expects NAME=FILE.npy or NAME=JSON"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(
    server: ServerThread,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    message: str,
) -> None:
    code, _, err = run(capsys, "-t", server.target, "predict", *argv)
    assert code == 2
    assert err.startswith("tensorctl: ") and message in err


def test_server_errors_exit_1_and_a_failed_model_is_unhealthy(
    server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "-t", server.target, "predict", "nope", "-i", "x=[[1]]")
    assert code == 1 and err.startswith("tensorctl: NOT_FOUND: ")
    assert run(capsys, "-t", server.target, "health", "mlp")[0] == 0
    code, out, _ = run(capsys, "-t", server.target, "health", "broken")
    assert code == 1 and "FAILED" in out


def test_any_tls_flag_means_tls(server: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    # The server speaks plaintext: a TLS client cannot talk to it, and must not fall back.
    code, _, err = run(
        capsys, "-t", server.target, "--timeout", "2", "--tls-server-name", "x", "health"
    )
    assert code == 1 and "UNAVAILABLE" in err
    code, _, err = run(capsys, "-t", server.target, "--tls-key", "/nonexistent", "health")
    assert code == 2 and "--tls-cert and --tls-key go together" in err
    code, _, err = run(capsys, "-t", server.target, "--tls-ca", "/nonexistent", "health")
    assert code == 2 and "/nonexistent" in err


def test_generate_json_records_have_every_field(
    server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys,
        "-t",
        server.target,
        "--json",
        "generate",
        "tinylm",
        "--token-ids",
        "5,6,7",
        "--max-tokens",
        "3",
        "--temperature",
        "0",
    )
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert records and all({"token_ids", "text", "index"} <= set(r) for r in records)
    assert records[0]["index"] == 0
    code, _, err = run(capsys, "-t", server.target, "generate", "tinylm", "--token-ids", "1,,2")
    assert code == 2 and "expected comma-separated integers" in err


def test_generate_request_takes_one_stop_string_and_numpy_token_ids() -> None:
    request = generate_request(
        "m", None, np.array([1, 2, 3]), 0, {"stop": "END", "stop_token_ids": 7}
    )
    assert list(request.sampling.stop) == ["END"]
    assert list(request.sampling.stop_token_ids) == [7]
    assert list(request.prompt_token_ids) == [1, 2, 3]


def test_client_options_are_checked_when_given() -> None:
    from tensord_client import Client, TLSOptions
    from tensord_client._common import channel_options

    for half in ({"certificate_chain": b"pem"}, {"private_key": b"pem"}):
        with pytest.raises(ValueError, match="certificate_chain and private_key go together"):
            TLSOptions(**half)  # gRPC's core would abort the process on the first call
    options = dict(channel_options(3, None, ()))
    assert options["grpc.per_rpc_retry_buffer_size"] >= 64 * 1024 * 1024  # large batches retry
    # A misspelt field fails at the call, not at the first next().
    with Client("127.0.0.1:9", retries=0) as client, pytest.raises(ValueError):
        client.generate("tinylm", token_ids=[1, 2], max_token=5)


def test_generate_starts_when_called(server: ServerThread) -> None:
    import time

    from tensord_client import Client

    with Client(server.target, retries=0) as client:
        stream = client.generate(
            "tinylm", token_ids=[5, 6], max_tokens=2000, ignore_eos=True, timeout=0.3
        )
        time.sleep(0.5)  # the deadline counts from the call, not from the first read
        with pytest.raises(grpc.RpcError) as info:
            list(stream)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_the_target_comes_from_tensord_target(
    server: ServerThread, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORD_TARGET", server.target)
    code, out, err = run(capsys, "health", "mlp")
    assert code == 0, err
    assert out.splitlines()[0] == "server: SERVING"
    code, _, err = run(capsys, "--timeout", "2", "-t", "127.0.0.1:9", "health")
    assert code == 1 and err.startswith("tensorctl: UNAVAILABLE: ")  # --target wins


def test_health_exits_1_when_the_server_is_not_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "garbage" / "1").mkdir(parents=True)
    (tmp_path / "garbage" / "1" / "model.onnx").write_bytes(b"not a model")
    srv = start_server(tmp_path)  # no model can serve: health is NOT_SERVING
    try:
        code, out, _ = run(capsys, "-t", srv.target, "health")
        assert code == 1
        assert out.splitlines()[0] == "server: NOT_SERVING"
        code, out, _ = run(capsys, "-t", srv.target, "--json", "health")
        assert code == 1 and json.loads(out)["status"] == "SERVING_STATUS_NOT_SERVING"
    finally:
        srv.stop()


def test_help_documents_the_target_variable_and_the_exit_statuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "$TENSORD_TARGET, else 127.0.0.1:50051" in " ".join(out.split())
    assert "exit status:" in out and "130" in out
    code, out, _ = run(capsys, "health", "--help")
    assert code == 0
    assert "0  the server is SERVING" in out and "1  it is not, or it did not answer" in out


def test_a_reader_that_leaves_early_ends_it_quietly(server: ServerThread) -> None:
    import os
    import subprocess
    import sys

    # Status 1, as the Python documentation's note on SIGPIPE has it (argparse's --help
    # drops a write that fails at once, unbuffered, and exits 0). Output to a pipe is
    # buffered unless PYTHONUNBUFFERED says otherwise: both ways.
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    for env in (buffered, {**buffered, "PYTHONUNBUFFERED": "1"}):
        for argv, statuses in ((["--json", "info"], {1}), (["--help"], {0, 1})):
            read, write = os.pipe()
            os.close(read)  # the reader has left before the first byte: every write fails
            try:
                result = subprocess.run(
                    [sys.executable, "-m", "tensord_client.cli", "-t", server.target, *argv],
                    stdout=write,
                    stderr=subprocess.PIPE,
                    env=env,
                    text=True,
                    timeout=60,
                )
            finally:
                os.close(write)
            assert result.returncode in statuses and result.stderr == "", (argv, result)


def test_health_waits_for_a_daemon_still_starting(
    small_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:  # a port nothing listens on yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    waiting = subprocess.Popen(
        [sys.executable, "-m", "tensord_client.cli", "-t", f"127.0.0.1:{port}", "health", "mlp",
         "--wait", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # tensorctl is asking by now, and hearing UNAVAILABLE
        srv = start_server(small_repo, listen=f"127.0.0.1:{port}")
    finally:
        out, err = waiting.communicate(timeout=60)
    try:
        assert waiting.returncode == 0, err
        assert out.splitlines()[0] == "server: SERVING"
        # A model that never comes: asked again until the wait is over, then NOT_FOUND.
        code, _, err = run(capsys, "-t", srv.target, "health", "nope", "--wait", "0.5")
        assert code == 1 and err.startswith("tensorctl: NOT_FOUND: ")
    finally:
        srv.stop()
