"""Creating ONNX Runtime sessions the way a server needs them on a GPU host.

Three things ONNX Runtime's Python layer does quietly are made loud or undone here:

- When a session with the requested providers fails to start, `InferenceSession` retries
  it with its fallback providers and *no provider options*: a CUDA session then runs on
  ONNX Runtime's own stream, not the lane's, and may read inputs before the lane's copies
  finish. `StrictSession` turns that retry off, and `check_provider_options` verifies,
  after creation, that a CUDA or TensorRT provider really took the lane's stream.
- onnxruntime-gpu's CUDA provider library has no RUNPATH to the nvidia-* wheels' cuBLAS,
  cuDNN and cudart; unless they are loaded first (`onnxruntime.preload_dlls`) the provider
  may fail to load and the model run on the CPU. `prepare_cuda_libraries` loads them once.
- The TensorRT provider is listed by every onnxruntime-gpu build, installed TensorRT or
  not; `usable_providers` drops it where TensorRT's runtime library cannot be loaded, so it
  is not ranked first only to fail.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import onnxruntime as ort
import structlog

log = structlog.get_logger("tensord.backends")

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
_TENSORRT_LIBRARIES = ("libnvinfer.so.10", "libnvinfer.so")


class StrictSession(ort.InferenceSession):
    """An InferenceSession that fails when its providers fail, instead of retrying with
    the fallback providers and no provider options."""

    def _create_inference_session(self, *args: Any, **kwargs: Any) -> Any:
        # InferenceSession.__init__ consults _enable_fallback when this raises.
        self._enable_fallback = False
        return super()._create_inference_session(*args, **kwargs)


@functools.cache
def tensorrt_loadable() -> str:
    """ "" when TensorRT's runtime library loads in this process, else why not."""
    errors = []
    for name in _TENSORRT_LIBRARIES:
        try:
            ctypes.CDLL(name)
            return ""
        except OSError as exc:
            errors.append(str(exc))
    try:  # the tensorrt wheel loads its bundled libraries when imported
        import tensorrt  # noqa: F401
    except Exception as exc:
        errors.append(f"import tensorrt: {exc}")
    else:
        return ""
    return "; ".join(errors)


def usable_providers(available: Sequence[str]) -> list[str]:
    """`available` without the TensorRT provider where TensorRT cannot be loaded."""
    if TENSORRT in available and tensorrt_loadable():
        return [p for p in available if p != TENSORRT]
    return list(available)


@functools.cache
def prepare_cuda_libraries() -> str:
    """Load the CUDA and cuDNN libraries of the nvidia-* wheels before a CUDA session
    (once per process); returns what happened, for the log."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return "onnxruntime has no preload_dlls; the CUDA libraries come from the library path"
    try:
        preload(cuda=True, cudnn=True, msvc=False)
    except Exception as exc:  # the wheels are absent: a system CUDA may still serve
        outcome = f"preload_dlls failed ({exc}); the CUDA libraries come from the library path"
    else:
        outcome = "loaded the CUDA and cuDNN libraries of the nvidia-* wheels"
    log.info("onnxruntime.cuda_libraries", outcome=outcome)
    return outcome


def check_provider_options(
    session: ort.InferenceSession, requested: Sequence[tuple[str, dict[str, str]]]
) -> None:
    """RuntimeError when a CUDA or TensorRT provider asked to run on a given stream does
    not report that stream after creation (it would run on its own)."""
    actual = session.get_provider_options()
    for name, options in requested:
        stream = options.get("user_compute_stream")
        if stream is None or name not in actual:
            continue
        took = actual[name].get("user_compute_stream")
        if took is not None and str(took) != str(stream):
            raise RuntimeError(
                f"{name} runs on stream {took}, not the lane's stream {stream}: its copies "
                "and runs would not be ordered"
            )
