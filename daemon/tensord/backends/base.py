"""What every backend offers the layers above it: a signature and a blocking run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tensord.dtypes import DType, ort_type


@dataclass(slots=True, frozen=True)
class TensorSpec:
    """One input or output: name, dtype and shape, -1 for a dynamic dimension."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    rank_known: bool = True
    """False when the model gives no shape at all (not even a rank); `shape` is then ()."""


@dataclass(slots=True, frozen=True)
class DeviceOptions:
    """Where a GPU backend runs: the CUDA device, the lane's stream, the cache directory."""

    device_id: int = 0
    cuda_stream: int | None = None
    """The address of the lane's cudaStream_t; None for the default stream."""
    cache_directory: Path = Path("cache")


@dataclass(slots=True, frozen=True)
class DeviceTensor:
    """A tensor in device memory: its address, ONNX element type and shape."""

    ptr: int
    onnx_type: int
    shape: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class BackendPlacement:
    """Where a backend really runs, and why: reported in Info and the start-up log."""

    backend: str
    provider: str
    provider_reason: str
    requested_providers: tuple[str, ...]


class Backend(Protocol):
    """A loaded model. `run` blocks; callers run it on a worker thread."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    placement: BackendPlacement

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        """Run once; returns the named outputs in the order asked for."""
        ...

    def terminate_runs(self) -> None:
        """Cut the runs in progress short (from any thread); they raise UnavailableError.
        The drain calls it once its grace has run out. A backend that cannot stop a run
        midway lets it finish."""
        ...

    def close(self) -> None:
        """Release the model's memory."""
        ...


@dataclass(slots=True)
class PooledOutput:
    """A backend's output in a device buffer of its pool, read as an OrtValue is
    (data_ptr, shape, data_type); the executor calls `release` after its copy."""

    buffer: Any
    """A pool's buffer (its `ptr` is the device address)."""
    dims: tuple[int, ...]
    dtype: DType
    pool: Any

    def data_ptr(self) -> int:
        return int(self.buffer.ptr)

    def shape(self) -> tuple[int, ...]:
        return self.dims

    def data_type(self) -> str:
        return ort_type(self.dtype)

    def release(self) -> None:
        self.pool.release(self.buffer)


def release_output(value: object) -> None:
    """Return a backend output to its pool when it came from one (a PooledOutput, as the
    native TensorRT backend's); an OrtValue or a host array frees itself when dropped."""
    release = getattr(value, "release", None)
    if callable(release):
        release()
