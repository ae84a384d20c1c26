"""How tensord opens ONNX Runtime sessions on GPU hosts, checked on the CPU with the real
ONNX Runtime: no silent retry without provider options, TensorRT not ranked where it
cannot load, the lane's stream verified after creation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from onnx import TensorProto

from tensord.backends.ort_session import (
    StrictSession,
    check_provider_options,
    prepare_cuda_libraries,
    tensorrt_loadable,
    usable_providers,
)
from tests.models import build_identity


def _failing_once(base: type) -> type:
    """`base` whose first session creation fails as a provider that cannot start does."""

    class FailingOnce(base):  # type: ignore[misc,valid-type]
        attempts = 0

        def _create_inference_session(self, providers: Any, options: Any, *rest: Any) -> Any:
            type(self).attempts += 1
            result = super()._create_inference_session(providers, options, *rest)
            if type(self).attempts == 1:
                raise RuntimeError("CUDA failure 35: driver too old")
            return result

    return FailingOnce


def test_a_failed_provider_is_not_retried_without_its_options(tmp_path: Path) -> None:
    model = str(build_identity(tmp_path / "m.onnx", TensorProto.FLOAT))
    plain = _failing_once(ort.InferenceSession)
    plain(model, providers=["CPUExecutionProvider"])  # ONNX Runtime retries, silently
    assert plain.attempts == 2
    strict = _failing_once(StrictSession)
    with pytest.raises(RuntimeError, match="driver too old"):
        strict(model, providers=["CPUExecutionProvider"])
    assert strict.attempts == 1


def test_tensorrt_is_not_ranked_where_it_cannot_load() -> None:
    listed = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    if tensorrt_loadable():  # this host has no TensorRT: the provider goes
        assert usable_providers(listed) == listed[1:]
    else:
        assert usable_providers(listed) == listed
    assert usable_providers(["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


class _Reported:
    """A session as far as check_provider_options reads it."""

    def __init__(self, options: dict[str, dict[str, str]]) -> None:
        self.options = options

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return self.options


def test_the_lanes_stream_is_verified_after_creation() -> None:
    asked = [
        ("CUDAExecutionProvider", {"user_compute_stream": "1234"}),
        ("CPUExecutionProvider", {}),
    ]
    ok = _Reported({"CUDAExecutionProvider": {"user_compute_stream": "1234"}})
    check_provider_options(ok, asked)  # type: ignore[arg-type]
    own = _Reported({"CUDAExecutionProvider": {"user_compute_stream": "0"}})
    with pytest.raises(RuntimeError, match="runs on stream 0, not the lane's stream 1234"):
        check_provider_options(own, asked)  # type: ignore[arg-type]


def test_cuda_libraries_are_prepared_once_and_say_how() -> None:
    first = prepare_cuda_libraries()
    assert prepare_cuda_libraries() is first
    assert "CUDA" in first
