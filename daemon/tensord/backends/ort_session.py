"""Creating ONNX Runtime sessions the way a server needs them on a GPU host.

Three things ONNX Runtime's Python layer does quietly are made loud or undone here:

- When a session with the requested providers fails to start, `InferenceSession` retries
  it with its fallback providers and *no provider options*: a CUDA session then runs on
  ONNX Runtime's own stream, not the lane's, and may read inputs before the lane's copies
  finish. `StrictSession` turns that retry off, and `check_provider_options` verifies,
  after creation, that a CUDA or TensorRT provider really took the lane's stream.
- onnxruntime-gpu's CUDA provider library has no RUNPATH to the nvidia-* wheels' cuBLAS,
  cuDNN and cudart; unless they are loaded first the provider may fail to load and the
  model run on the CPU. `prepare_cuda_libraries` loads them once (cuda_libraries.py).
- The TensorRT provider is listed by every onnxruntime-gpu build, installed TensorRT or
  not; `usable_providers` drops it where the TensorRT runtime that provider links
  (`libnvinfer.so.10`) cannot be loaded, so it is not ranked first only to fail.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import onnxruntime as ort
import structlog

from tensord.backends.cuda_libraries import prepare

log = structlog.get_logger("tensord.backends")

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT_MAJOR = 10
"""The TensorRT major that onnxruntime-gpu 1.31's TensorRT provider is linked against: its
library needs `libnvinfer.so.10`. An unversioned `libnvinfer.so` (a development link to any
release, TensorRT 8 as well) proves nothing about it."""
TENSORRT_LIBRARY = f"libnvinfer.so.{TENSORRT_MAJOR}"


class StrictSession(ort.InferenceSession):
    """An InferenceSession that fails when its providers fail, instead of retrying with
    the fallback providers and no provider options."""

    def _create_inference_session(self, *args: Any, **kwargs: Any) -> Any:
        # InferenceSession.__init__ consults _enable_fallback when this raises.
        self._enable_fallback = False
        return super()._create_inference_session(*args, **kwargs)


@functools.cache
def tensorrt_loadable() -> str:
    """ "" when the TensorRT runtime the TensorRT provider needs loads in this process,
    else why not."""
    try:
        ctypes.CDLL(TENSORRT_LIBRARY)
    except OSError as exc:
        library_error = str(exc)
    else:
        return ""
    try:  # the tensorrt wheel loads its bundled libraries when imported
        import tensorrt
    except Exception as exc:
        return f"{library_error}; import tensorrt: {exc}"
    return tensorrt_version_mismatch(str(getattr(tensorrt, "__version__", "")))


def tensorrt_version_mismatch(version: str) -> str:
    """ "" when a tensorrt wheel of `version` serves the TensorRT provider, else why not."""
    major = version.split(".", 1)[0]
    if major == str(TENSORRT_MAJOR):
        return ""
    return (
        f"{TENSORRT_LIBRARY} is not on the library path, and the tensorrt package is "
        f"{version or 'of an unknown version'}: the TensorRT provider needs TensorRT "
        f"{TENSORRT_MAJOR}"
    )


def usable_providers(available: Sequence[str]) -> list[str]:
    """`available` without the TensorRT provider where TensorRT cannot be loaded."""
    if TENSORRT in available and tensorrt_loadable():
        return [p for p in available if p != TENSORRT]
    return list(available)


@functools.cache
def prepare_cuda_libraries() -> str:
    """Load the CUDA and cuDNN libraries the CUDA provider needs before its first session
    (once per process, `cuda_libraries.prepare`); returns what happened, for the log."""
    cuda_version = str(getattr(ort, "cuda_version", "") or "")
    if not cuda_version:
        outcome = f"onnxruntime {ort.__version__} is not a CUDA build: no CUDA libraries to load"
    else:
        report = prepare(cuda_version, getattr(ort, "preload_dlls", None))
        outcome = f"CUDA {cuda_version} build: {report.describe()}"
    log.info("onnxruntime.cuda_libraries", outcome=outcome)
    return outcome


def check_provider_options(
    session: ort.InferenceSession, requested: Sequence[tuple[str, dict[str, str]]]
) -> None:
    """RuntimeError when a CUDA or TensorRT provider asked to run on a given stream does
    not report that stream after creation, or none (it would run on its own)."""
    actual = session.get_provider_options()
    for name, options in requested:
        stream = options.get("user_compute_stream")
        if stream is None or name not in actual:
            continue
        took = actual[name].get("user_compute_stream")
        if took is None or str(took) != str(stream):
            raise RuntimeError(
                f"{name} runs on stream {took or 'of its own'}, not the lane's stream "
                f"{stream}: its copies and runs would not be ordered"
            )
