"""The CUDA executor: each lane is a CUDA stream with its own backend session.

A batch on a lane: join rows into a pinned buffer -> async H2D into a pooled device
buffer -> the backend runs on device pointers on the lane's stream (ONNX Runtime
IOBinding) -> async D2H into pinned buffers -> an event marks completion. With two or
more lanes, batch k+1's copies overlap batch k's compute on another stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import runtime as cudart

from tensord import dtypes
from tensord.backends.base import DeviceTensor, release_output
from tensord.cuda.memory import CudaBuffer, DevicePool, PinnedHostPool
from tensord.cuda.pools import PoolStats
from tensord.cuda.runtime import check
from tensord.executor.lanes import LaneExecutor
from tensord.executor.split import rows_of

H2D = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
D2H = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost


@dataclass(slots=True)
class Lane:
    """One CUDA stream, its completion event and its backend session."""

    stream: Any
    done: Any
    backend: Any


class CudaExecutor(LaneExecutor):
    """Lanes of CUDA streams over one device, with pinned host and device buffer pools."""

    kind = "cuda"

    def __init__(
        self,
        name: str,
        make_backend: Callable[[int], Any],
        lanes: int,
        device_id: int = 0,
        reason: str = "",
    ) -> None:
        self.device_id = device_id
        check(cudart.cudaSetDevice(device_id), "cudaSetDevice")
        self.pinned = PinnedHostPool()
        self.device = DevicePool()
        self._lanes: list[Lane] = []
        try:
            for _ in range(lanes):
                self._lanes.append(self._make_lane(make_backend))
        except BaseException:  # a failed load frees what the lanes made so far
            self._free_lanes()
            self.pinned.clear()
            self.device.clear()
            raise
        super().__init__(name, lanes, reason)

    def _make_lane(self, make_backend: Callable[[int], Any]) -> Lane:
        stream = check(
            cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags",
        )
        try:
            done = check(
                cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming),
                "cudaEventCreateWithFlags",
            )
            try:
                return Lane(stream, done, make_backend(int(stream)))
            except BaseException:
                cudart.cudaEventDestroy(done)
                raise
        except BaseException:
            cudart.cudaStreamDestroy(stream)
            raise

    def _free_lanes(self) -> None:
        for lane in self._lanes:
            lane.backend.close()
            cudart.cudaEventDestroy(lane.done)
            cudart.cudaStreamDestroy(lane.stream)

    @property
    def lane_backends(self) -> list[Any]:
        """Each lane's backend session, in lane order."""
        return [lane.backend for lane in self._lanes]

    @property
    def primary_backend(self) -> Any:
        """Lane 0's backend (its signature and placement describe the model)."""
        return self._lanes[0].backend

    def _lane_started(self) -> None:
        # The current device is per host thread in the CUDA runtime.
        check(cudart.cudaSetDevice(self.device_id), "cudaSetDevice")

    def _execute(
        self, index: int, parts: Sequence[Mapping[str, np.ndarray]], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        lane = self._lanes[index]
        taken: list[tuple[PinnedHostPool | DevicePool, CudaBuffer]] = []
        held: list[Any] = []  # backend outputs in device memory, released after the copies
        try:
            return self._pipeline(lane, parts, output_names, taken, held)
        finally:
            # Copies may still be in flight after a failure: wait before buffers are reused.
            synced = cudart.cudaStreamSynchronize(lane.stream)
            for pool, buffer in taken:
                pool.release(buffer)
            for value in held:
                release_output(value)
            # An error the stream reports here (a kernel that faulted after its launch was
            # accepted) is the batch's real error: a sticky one must reach the daemon as a
            # lost device, not as whatever the batch failed with first.
            check(synced, "cudaStreamSynchronize (end of batch)")

    def _take(self, pool: PinnedHostPool | DevicePool, nbytes: int, taken: list[Any]) -> CudaBuffer:
        buffer = pool.acquire(nbytes)
        taken.append((pool, buffer))
        return buffer

    def _pipeline(
        self,
        lane: Lane,
        parts: Sequence[Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        taken: list[Any],
        held: list[Any],
    ) -> list[np.ndarray]:
        rows = rows_of(parts)
        device_inputs = {}
        for name, first in parts[0].items():
            dtype = dtypes.from_numpy(first.dtype)
            shape = (rows, *first.shape[1:])
            nbytes = int(np.prod(shape, dtype=np.int64)) * first.dtype.itemsize
            host = self._take(self.pinned, nbytes, taken)
            np.concatenate([p[name] for p in parts], out=host.view(first.dtype, shape))
            dev = self._take(self.device, nbytes, taken)
            if nbytes:
                check(
                    cudart.cudaMemcpyAsync(dev.ptr, host.ptr, nbytes, H2D, lane.stream),
                    "cudaMemcpyAsync H2D",
                )
            device_inputs[name] = DeviceTensor(dev.ptr, dtypes.ONNX_TYPES[dtype], shape)
        values = lane.backend.run_device(device_inputs, output_names)
        held.extend(values)
        staged = []
        for value in values:
            out_dtype = dtypes.from_ort_type(value.data_type())
            if out_dtype is None or out_dtype is dtypes.DType.STRING:
                raise TypeError(f"the CUDA executor cannot copy out {value.data_type()}")
            shape = tuple(value.shape())
            nbytes = int(np.prod(shape, dtype=np.int64)) * out_dtype.numpy.itemsize
            host = self._take(self.pinned, nbytes, taken)
            if nbytes:
                check(
                    cudart.cudaMemcpyAsync(host.ptr, value.data_ptr(), nbytes, D2H, lane.stream),
                    "cudaMemcpyAsync D2H",
                )
            staged.append((host, out_dtype.numpy, shape))
        check(cudart.cudaEventRecord(lane.done, lane.stream), "cudaEventRecord")
        check(cudart.cudaEventSynchronize(lane.done), "cudaEventSynchronize")
        # Copy out of the pinned buffers: they return to the pool for the next batch.
        return [host.view(dtype, shape).copy() for host, dtype, shape in staged]

    def _pools(self) -> dict[str, PoolStats]:
        return {"pinned": self.pinned.stats(), "device": self.device.stats()}

    def _idle(self) -> None:
        # cudaFree and cudaFreeHost synchronise the device: only now, never mid-batch.
        self.pinned.trim()
        self.device.trim()

    def terminate_runs(self) -> None:
        """Cut the runs in progress short on every lane's session."""
        for lane in self._lanes:
            lane.backend.terminate_runs()

    def close(self) -> None:
        """Wait for the lanes, free every buffer, stream and event."""
        self._stop_lanes(wait=True)
        self._free_lanes()
        self.pinned.clear()
        self.device.clear()
