"""Checked calls into the CUDA runtime through cuda-python (`cuda.bindings.runtime`).

Every cuda-python call returns (error, *values); `check` turns a failure into a typed
error that names the call and the CUDA error, so no return code goes unread.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import runtime as cudart

from tensord.cuda.device_fault import STICKY_CUDA_ERRORS
from tensord.errors import DeviceLostError, InternalError, OutOfMemoryError

_SUCCESS = cudart.cudaError_t.cudaSuccess

# After these the CUDA context is unusable: the process must restart (systemd does).
STICKY_ERRORS = frozenset(
    getattr(cudart.cudaError_t, name)
    for name in STICKY_CUDA_ERRORS.values()
    if hasattr(cudart.cudaError_t, name)
)


class CudaError(InternalError):
    """A CUDA runtime call failed; `sticky` means the context is lost."""

    def __init__(self, call: str, error: Any) -> None:
        _, name = cudart.cudaGetErrorName(error)
        _, text = cudart.cudaGetErrorString(error)
        self.call = call
        self.error_name = name.decode() if isinstance(name, bytes) else str(name)
        self.sticky = error in STICKY_ERRORS
        detail = text.decode() if isinstance(text, bytes) else str(text)
        super().__init__(f"{call} failed: {self.error_name}: {detail}")


class StickyCudaError(CudaError, DeviceLostError):
    """A CUDA error after which the context is lost: the daemon drains and exits non-zero."""


def cuda_error(call: str, error: Any) -> CudaError:
    """The typed error for a failed call: StickyCudaError when the context is lost."""
    return StickyCudaError(call, error) if error in STICKY_ERRORS else CudaError(call, error)


class CudaOutOfMemoryError(OutOfMemoryError):
    """cudaErrorMemoryAllocation: the batch may be split and retried."""


def check(result: Any, call: str) -> Any:
    """The values of a cuda-python call's result, or CudaError/CudaOutOfMemoryError."""
    values = result if isinstance(result, tuple) else (result,)
    error, rest = values[0], values[1:]
    if error != _SUCCESS:
        if error == cudart.cudaError_t.cudaErrorMemoryAllocation:
            raise CudaOutOfMemoryError(f"{call} failed: cudaErrorMemoryAllocation (out of memory)")
        raise cuda_error(call, error)
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest
