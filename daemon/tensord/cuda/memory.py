"""Pinned host memory (cudaHostAlloc) and device memory (cudaMalloc), pooled by size class."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
from cuda.bindings import runtime as cudart

from tensord.cuda.pools import SizeClassPool
from tensord.cuda.runtime import CudaOutOfMemoryError, check


@dataclass(slots=True, frozen=True)
class CudaBuffer:
    """A raw allocation: its address and size in bytes."""

    ptr: int
    nbytes: int

    def view(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A NumPy array over the first bytes of a host-visible (pinned) buffer."""
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * dtype.itemsize
        if nbytes > self.nbytes:
            raise ValueError(f"view of {nbytes} bytes over a {self.nbytes}-byte buffer")
        if nbytes == 0:
            return np.empty(shape, dtype=dtype)
        raw = (ctypes.c_uint8 * nbytes).from_address(self.ptr)
        return np.frombuffer(memoryview(raw), dtype=dtype, count=count).reshape(shape)


def _out_of(memory: str, nbytes: int, call: str) -> CudaOutOfMemoryError:
    return CudaOutOfMemoryError(
        f"out of {memory}: {nbytes / 2**20:.1f} MiB for this batch could not be allocated "
        f"({call}: cudaErrorMemoryAllocation); send a smaller request, or retry when fewer run"
    )


def _pinned_alloc(nbytes: int) -> CudaBuffer:
    try:
        ptr = check(cudart.cudaHostAlloc(nbytes, cudart.cudaHostAllocPortable), "cudaHostAlloc")
    except CudaOutOfMemoryError:
        raise _out_of("pinned host memory", nbytes, "cudaHostAlloc") from None
    return CudaBuffer(int(ptr), nbytes)


def _pinned_free(buffer: CudaBuffer) -> None:
    check(cudart.cudaFreeHost(buffer.ptr), "cudaFreeHost")


def _device_alloc(nbytes: int) -> CudaBuffer:
    try:
        ptr = check(cudart.cudaMalloc(nbytes), "cudaMalloc")
    except CudaOutOfMemoryError:
        raise _out_of("GPU memory", nbytes, "cudaMalloc") from None
    return CudaBuffer(int(ptr), nbytes)


def _device_free(buffer: CudaBuffer) -> None:
    check(cudart.cudaFree(buffer.ptr), "cudaFree")


class PinnedHostPool(SizeClassPool[CudaBuffer]):
    """Page-locked host buffers for asynchronous copies; never one cudaHostAlloc per request."""

    def __init__(self, max_cached_bytes: int = 512 * 1024 * 1024) -> None:
        super().__init__(_pinned_alloc, _pinned_free, lambda b: b.nbytes, max_cached_bytes)


class DevicePool(SizeClassPool[CudaBuffer]):
    """Device buffers on the current device; never one cudaMalloc per request."""

    def __init__(self, max_cached_bytes: int = 1024 * 1024 * 1024) -> None:
        super().__init__(_device_alloc, _device_free, lambda b: b.nbytes, max_cached_bytes)
