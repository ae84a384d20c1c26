"""`tensord inspect`: a model file described (a decoder export with whether Generate can
serve it), anything else refused with a non-zero exit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from onnx import TensorProto

from tensord.cli import main
from tensord.errors import ModelLoadError
from tensord.inspect import inspect_model
from tests.hf_families import ExportCache
from tests.models import build_identity


def test_a_model_is_described(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = build_identity(tmp_path / "model.onnx", TensorProto.FLOAT)
    report = inspect_model(path)
    assert [t["name"] for t in report["inputs"]] == ["x"]
    assert "CPUExecutionProvider" in report["runnable_providers"]
    assert main(["inspect", str(path)]) == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty (0 bytes), not an ONNX model"),
        (b"\x08\x07", "is not an ONNX model: it holds no graph or no opset"),
        (b"hello\n", "is not a readable ONNX model"),
    ],
)
def test_anything_else_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        inspect_model(path)
    assert main(["inspect", str(path), "--json"]) == 2
    assert capsys.readouterr().err.startswith(f"tensord: {path} ")


def test_a_decoder_export_says_whether_generate_serves_it(
    hf_exports: ExportCache, capsys: pytest.CaptureFixture[str]
) -> None:
    """Symbolic dimension names, the verdict and the KV path (checked as at load): Gemma's
    attention rewritten onto KV slots."""
    path = hf_exports.get("gemma") / "model.onnx"
    report = inspect_model(path)
    (past,) = [t for t in report["inputs"] if t["name"] == "past_key_values.0.key"]
    assert past["dims"] == ["batch_size", 2, "past_sequence_length", 16]
    assert past["shape"] == [-1, 2, -1, 16]
    generator = report["generator"]
    assert generator["servable"] and generator["kv_path"] == "slots"
    assert generator["batch_layout"] == "ragged"
    assert generator["prefix_reuse"], generator["prefix_reuse_reason"]
    assert generator["feeds_position_ids"] and not generator["takes_position_ids"]
    assert (generator["model_type"], generator["kv_heads"], generator["head_dim"]) == (
        "gemma",
        2,
        16,
    )
    assert report["external_data"] == []
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "past_key_values.0.key    DATA_TYPE_FLOAT32 [batch_size, 2, past_sequence_length" in out
    assert "Generate: can serve it (gemma: 2 layers, 4 heads, 2 KV heads of 16" in out
    assert "KV path: slots: the export's attention was rewritten at load onto" in out


def test_an_export_the_rewrite_declines_stays_paged(
    hf_exports: ExportCache, capsys: pytest.CaptureFixture[str]
) -> None:
    """BLOOM's ALiBi: the paged pool, saying why not slots."""
    path = hf_exports.get("bloom") / "model.onnx"
    generator = inspect_model(path)["generator"]
    assert generator["servable"] and generator["kv_path"] == "paged"
    assert (
        "not on KV slots: bloom attention adds ALiBi position biases"
        in (generator["kv_path_reason"])
    )
    assert main(["inspect", str(path)]) == 0
    assert "KV path: paged: the graph grows its past by Concat" in capsys.readouterr().out


def test_a_decoder_it_cannot_serve_says_why(
    hf_exports: ExportCache, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DeepSeek-V3's keys and values differ in size; weights kept in an external file."""
    import shutil

    import onnx

    directory = shutil.copytree(hf_exports.get("deepseek_v3"), tmp_path / "ds")
    model = onnx.load(str(directory / "model.onnx"))
    onnx.save(model, str(directory / "model.onnx"), save_as_external_data=True,
              location="model.onnx_data")  # fmt: skip
    report = inspect_model(directory / "model.onnx")
    assert report["generator"]["servable"] is False
    assert "its keys have head size 24 and its values 16" in report["generator"]["reason"]
    (weights,) = report["external_data"]
    assert weights["path"] == str(directory / "model.onnx_data") and weights["size_bytes"] > 0
    assert main(["inspect", str(directory / "model.onnx")]) == 0
    out = capsys.readouterr().out
    assert f"  weights in {directory / 'model.onnx_data'}" in out
    assert "Generate: cannot serve it: " in out


def test_a_plain_model_has_no_generator_part(tmp_path: Path) -> None:
    path = build_identity(tmp_path / "model.onnx", TensorProto.FLOAT)
    assert "generator" not in inspect_model(path)


def test_a_reader_that_leaves_early_ends_it_quietly(tmp_path: Path) -> None:
    """`tensord inspect --json model.onnx | head -1`: no BrokenPipeError traceback."""
    import os
    import subprocess
    import sys

    path = build_identity(tmp_path / "model.onnx", TensorProto.FLOAT)
    # Output to a pipe is buffered unless PYTHONUNBUFFERED says otherwise: both ways.
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    for env in (buffered, {**buffered, "PYTHONUNBUFFERED": "1"}):
        read, write = os.pipe()
        os.close(read)  # the reader has left before the first byte: every write fails
        try:
            result = subprocess.run(
                [sys.executable, "-m", "tensord.cli", "inspect", "--json", str(path)],
                stdout=write,
                stderr=subprocess.PIPE,
                env=env,
                text=True,
                timeout=120,
            )
        finally:
            os.close(write)
        assert (result.returncode, result.stderr) == (1, "")


def test_a_builder_folder_is_described_with_its_slots(capsys: pytest.CaptureFixture[str]) -> None:
    """A model-builder folder: its window, the slot path and one slot's bytes; a bf16 CUDA
    build is refused on the CPU with the providers it was built for."""
    from tests.genai_models import build_families

    built = build_families()
    report = inspect_model(built["gemma2"].path / "model.onnx")
    generator = report["generator"]
    assert generator["servable"], generator
    assert (generator["kv_path"], generator["batch_layout"]) == ("slots", "ragged")
    assert generator["sliding_window"] == {"window_size": 8, "layers": [0]}
    assert generator["built_for"] == ["cpu"]
    # Layer 0 holds the window (8 positions), layer 1 the whole max_model_len (256).
    per_position = 2 * 2 * 16 * 4  # keys and values, 2 KV heads of 16 floats
    assert generator["slot_bytes_at_default_max_model_len"] == per_position * (8 + 256)
    assert not generator["prefix_reuse"]  # its ring of 8 positions holds under two blocks
    assert "a slot holds positions as they are only up to 8" in generator["prefix_reuse_reason"]
    assert main(["inspect", str(built["gemma2"].path / "model.onnx")]) == 0
    out = capsys.readouterr().out
    assert "  sliding window of 8 on layers [0]" in out and "KV path: slots: " in out
    assert "  prompt prefixes: not reused: a slot holds positions" in out
    refused = inspect_model(built["llama_bf16_cuda"].path / "model.onnx")["generator"]
    assert refused["servable"] is False and "built for cuda" in refused["reason"]
