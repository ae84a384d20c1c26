"""How tensord opens ONNX Runtime sessions on GPU hosts, checked on the CPU with the real
ONNX Runtime: no silent retry without provider options, TensorRT not ranked where it
cannot load, the lane's stream verified after creation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from onnx import TensorProto

from tensord.backends import onnxruntime as ort_backend
from tensord.backends.ort_session import (
    TENSORRT_LIBRARY,
    StrictSession,
    check_provider_options,
    prepare_cuda_libraries,
    tensorrt_loadable,
    tensorrt_version_mismatch,
    usable_providers,
)
from tensord.errors import ModelLoadError
from tests.models import build_identity

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"


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


def test_tensorrt_must_be_the_major_the_provider_links() -> None:
    assert TENSORRT_LIBRARY == "libnvinfer.so.10"  # not an unversioned libnvinfer.so
    assert tensorrt_version_mismatch("10.13.3.9") == ""
    assert "needs TensorRT 10" in tensorrt_version_mismatch("8.6.1")
    assert "needs TensorRT 10" in tensorrt_version_mismatch("")


def _failing_providers(failing: set[str], attempts: list[list[str]]) -> type:
    """StrictSession whose creation fails, as a provider that cannot start does, while its
    first provider is in `failing`; records each attempt's provider list. The real ONNX
    Runtime (a CPU build) then creates the session, leaving out the providers it lacks."""

    class FailingProviders(StrictSession):
        def __init__(self, source: Any, sess_options: Any, providers: Any) -> None:
            names = [p[0] if isinstance(p, tuple) else p for p in providers]
            attempts.append(names)
            if names[0] in failing:
                raise RuntimeError(f"{names[0]}: CUDA failure 35: driver too old\nmore")
            super().__init__(source, sess_options=sess_options, providers=[CPU])

    return FailingProviders


@pytest.mark.parametrize(
    ("failing", "tried", "reason"),
    [
        ({TRT}, [[TRT, CUDA, CPU], [CUDA, CPU]],
         f"{TRT} failed to start ({TRT}: CUDA failure 35: driver too old); running on {CPU}"),
        ({TRT, CUDA}, [[TRT, CUDA, CPU], [CUDA, CPU], [CPU]],
         f"{TRT} failed to start ({TRT}: CUDA failure 35: driver too old); "
         f"{CUDA} failed to start ({CUDA}: CUDA failure 35: driver too old); running on {CPU}"),
        (set(), [[TRT, CUDA, CPU]], ""),
    ],
)  # fmt: skip
def test_a_provider_that_fails_to_start_hands_over_to_the_next(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failing: set[str],
    tried: list[list[str]],
    reason: str,
) -> None:
    """TensorRT failing to load tries CUDA next, not the CPU at once."""
    model = build_identity(tmp_path / "m.onnx", TensorProto.FLOAT)
    attempts: list[list[str]] = []
    monkeypatch.setattr(ort_backend, "StrictSession", _failing_providers(failing, attempts))
    monkeypatch.setattr(ort_backend, "prepare_cuda_libraries", lambda: "")
    requested = [(TRT, {}), (CUDA, {"device_id": "0"}), (CPU, {})]
    session, why = ort_backend._open_session(model, None, ort.SessionOptions(), requested)
    assert attempts == tried
    assert why == reason
    assert session.get_providers()[0] == CPU


def test_a_model_no_provider_loads_fails_with_the_cpus_reason(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="ONNX Runtime cannot load"):
        ort_backend._open_session(broken, None, ort.SessionOptions(), [(CPU, {})])


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
    silent = _Reported({"CUDAExecutionProvider": {"device_id": "0"}})
    with pytest.raises(RuntimeError, match="runs on stream of its own, not the lane's"):
        check_provider_options(silent, asked)  # type: ignore[arg-type]


def test_cuda_libraries_are_prepared_once_and_say_how() -> None:
    first = prepare_cuda_libraries()
    assert prepare_cuda_libraries() is first
    assert "CUDA" in first


def test_a_lost_device_at_session_creation_is_not_hidden_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sticky CUDA error (999 too) while a session starts means the device is gone: the
    load fails as a lost device instead of quietly running on the CPU."""
    from tensord.errors import DeviceLostError

    model = build_identity(tmp_path / "m.onnx", TensorProto.FLOAT)
    attempts: list[list[str]] = []

    class Lost(StrictSession):
        def __init__(self, source: Any, sess_options: Any, providers: Any) -> None:
            attempts.append([p[0] for p in providers])
            raise RuntimeError("CUDA failure 999: unknown error ; GPU=0 ; expr=cudaSetDevice")

    monkeypatch.setattr(ort_backend, "StrictSession", Lost)
    monkeypatch.setattr(ort_backend, "prepare_cuda_libraries", lambda: "")
    requested = [(CUDA, {"device_id": "0"}), (CPU, {})]
    with pytest.raises(DeviceLostError, match="cudaErrorUnknown"):
        ort_backend._open_session(model, None, ort.SessionOptions(), requested)
    assert attempts == [[CUDA, CPU]]
