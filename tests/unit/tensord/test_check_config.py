"""`tensord check-config` on real repositories: each model's versions, kind, inputs and
outputs, or the reason it cannot be served; the entries skipped; exit 1 when a model is
broken. Graphs are read with onnx only (no ONNX Runtime session)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensord.cli import main
from tensord.demo.repository import IR_VERSION, OPSET
from tests.models import build_identity, build_two_outputs


def check_config(repo: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    code = main(["check-config", "--model-repository", str(repo)])
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def save_unchecked(graph: onnx.GraphProto, path: Path, **save: object) -> None:
    """Save a model as written, without onnx.checker (to build broken ones)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path), **save)  # type: ignore[arg-type]


def test_a_healthy_repository_lists_every_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_identity(tmp_path / "ident" / "1" / "model.onnx", TensorProto.INT32)
    build_identity(tmp_path / "ident" / "2" / "model.onnx", TensorProto.INT32)
    build_two_outputs(tmp_path / "pair" / "3" / "model.onnx")
    (tmp_path / "pair" / "model.toml").write_text(
        'max_batch_size = 8\n[[inputs]]\nname = "a"\nshape = [-1, 3]\n'
    )
    code, out, err = check_config(tmp_path, capsys)
    assert code == 0
    assert json.loads(out)["model_repository"] == str(tmp_path)  # stdout: the settings
    assert err == [
        f"model repository {tmp_path}: 2 model(s), 0 with a problem; 0 entries skipped",
        "  ident (predict), version(s) 1, 2",
        "    v1:",
        "      input  x: int32 [batch, 4]",
        "      output y: int32 [batch, 4]",
        "    v2: the inputs and outputs of v1",
        "  pair (predict), version(s) 3",
        "    v3:",
        "      input  a: float32 [batch, 3]",
        "      input  b: float32 [batch, 3]",
        "      output sum: float32 [batch, 3]",
        "      output product: float32 [batch, 3]",
    ]


def test_broken_models_are_reported_with_why_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_identity(tmp_path / "good" / "1" / "model.onnx", TensorProto.FLOAT)
    (tmp_path / "garbage" / "1").mkdir(parents=True)
    (tmp_path / "garbage" / "1" / "model.onnx").write_bytes(b"this is not an ONNX file")
    (tmp_path / "empty" / "1").mkdir(parents=True)
    (tmp_path / "empty" / "1" / "model.onnx").write_bytes(b"")
    build_identity(tmp_path / "misnamed" / "1" / "resnet.onnx", TensorProto.FLOAT)
    # A graph onnx.checker refuses: a node reads a tensor nothing makes.
    save_unchecked(
        helper.make_graph(
            [helper.make_node("Relu", ["nope"], ["y"])],
            "dangling",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        ),
        tmp_path / "dangling" / "1" / "model.onnx",
    )
    # Weights in a file beside the model, and that file gone.
    weights = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    save_unchecked(
        helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "external",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
            [weights],
        ),
        tmp_path / "external" / "1" / "model.onnx",
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    (tmp_path / "external" / "1" / "weights.bin").unlink()
    # A type tensord cannot carry, and an override that does not fit the graph.
    build_identity(tmp_path / "uint16" / "1" / "model.onnx", TensorProto.UINT16)
    build_identity(tmp_path / "override" / "1" / "model.onnx", TensorProto.FLOAT)
    (tmp_path / "override" / "model.toml").write_text('[[inputs]]\nname = "x"\nshape = [1]\n')
    (tmp_path / "foo.onnx").write_bytes(b"")

    code, _, err = check_config(tmp_path, capsys)
    assert code == 1
    root = tmp_path
    problems = [line.strip() for line in err if line.strip().startswith("model problem:")]
    assert problems == [
        f"model problem: dangling v1: {root}/dangling/1/model.onnx: onnx.checker refuses the "
        "model: Nodes in a graph must be topologically sorted, however input 'nope' of node: "
        "name: OpType: Relu is not output of any previous nodes.",
        f"model problem: empty v1: {root}/empty/1/model.onnx is empty (0 bytes), not an ONNX model",
        f"model problem: external v1: {root}/external/1/model.onnx: initializer 'w' keeps its "
        f"weights in 'weights.bin', but {root}/external/1/weights.bin does not exist",
        f"model problem: garbage v1: {root}/garbage/1/model.onnx is not a readable ONNX model: "
        "Error parsing message with type 'onnx.ModelProto': Wire format was corrupt",
        f"model problem: misnamed v1: {root}/misnamed/1/model.onnx does not exist; 1/ holds "
        f'resnet.onnx: set model_file = "resnet.onnx" in {root}/misnamed/model.toml',
        "model problem: override v1: model.toml inputs[0] 'x': shape [1] has rank 1, the "
        "model's [-1, 4] has 2",
        "model problem: uint16 v1: input 'x' has type UINT16, which tensord cannot carry",
    ]
    assert err[0] == f"model repository {root}: 8 model(s), 7 with a problem; 1 entry skipped"
    assert "  good (predict), version(s) 1" in err
    assert err[-1] == (
        "  skipped foo.onnx: a model file at the top of the repository, where each model is a "
        "directory: move it to foo/1/model.onnx (served as model 'foo', version 1)"
    )


def test_a_generator_is_described_from_its_directory(
    demo_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = check_config(demo_repo, capsys)
    assert code == 0
    start = err.index("  tinylm (generator), version(s) 1")
    assert err[start + 1 : start + 7] == [
        "    v1:",
        "      input  input_ids: int64 [batch_size, sequence_length]",
        "      input  attention_mask: int64 [batch_size, total_sequence_length]",
        "      input  position_ids: int64 [batch_size, sequence_length]",
        "      output logits: float32 [batch_size, sequence_length, 2048]",
        "      note: llama: 4 layers, vocabulary 2048, context 2048; KV cache float32 "
        "[batch_size, 2, past_sequence_length, 64] per layer (past_key_values.* in, "
        "present.* out, fed by the engine)",
    ]
