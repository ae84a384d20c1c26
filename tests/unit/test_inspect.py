"""`tensord inspect`: a model file described, anything else refused with a non-zero exit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from onnx import TensorProto

from tensord.cli import main
from tensord.errors import ModelLoadError
from tensord.inspect import inspect_model
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
