"""A lane's session that runs a real ONNX model on ONNX Runtime's CPU provider behind
device buffers: the daemon's GPU pre- and postprocessing on a device without
onnxruntime-gpu.

`run_device` waits for the lane's stream (the executor's upload and the preprocessing
kernel), copies the model's inputs to the host, runs the CPU session, and copies its
outputs into buffers of its own DevicePool on the lane's stream, where the
postprocessing kernels read them; the executor releases them after its copies. The
placement says "CUDA", so the registry puts the model on the CUDA executor and wraps each
lane in the device processing, exactly as it does for the CUDA provider.

Used by tests/gpu/test_device_processing.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cuda.bindings import runtime as cudart

from tensord import dtypes
from tensord.backends.base import BackendPlacement, DeviceOptions, DeviceTensor, PooledOutput
from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.cuda.memory import DevicePool
from tensord.cuda.runtime import check
from tensord.modelconfig.model import ModelConfig

H2D = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
D2H = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
_FROM_ONNX = {code: dtype for dtype, code in dtypes.ONNX_TYPES.items()}


class HostModelBackend:
    """The CPU session of `path` behind one lane's device buffers (stream `stream`)."""

    def __init__(self, path: Path, config: ModelConfig, where: DeviceOptions) -> None:
        self.stream = int(where.cuda_stream or 0)
        cpu = config.model_copy(update={"providers": ["CPUExecutionProvider"]})
        self.inner = OnnxRuntimeBackend(path, cpu)
        self.inputs, self.outputs = self.inner.inputs, self.inner.outputs
        self.placement = BackendPlacement(
            "onnxruntime",
            "CUDA",
            "ONNX Runtime's CPU provider behind device buffers (stand-in for the CUDA provider)",
            ("CUDA",),
        )
        self.pool = DevicePool()
        self.runs = 0
        """run_device calls: proof that batches came through the device path."""

    def run_device(
        self, inputs: Mapping[str, DeviceTensor], output_names: Sequence[str]
    ) -> list[PooledOutput]:
        check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        feeds = {}
        for name, tensor in inputs.items():
            host = np.empty(tensor.shape, _FROM_ONNX[tensor.onnx_type].numpy)
            if host.nbytes:
                check(
                    cudart.cudaMemcpyAsync(
                        host.ctypes.data, tensor.ptr, host.nbytes, D2H, self.stream
                    ),
                    "cudaMemcpyAsync D2H",
                )
            feeds[name] = host
        check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        results = self.inner.run(feeds, output_names)
        outputs = []
        for array in results:
            array = np.ascontiguousarray(array)
            buffer = self.pool.acquire(max(array.nbytes, 1))
            outputs.append(
                PooledOutput(buffer, array.shape, dtypes.from_numpy(array.dtype), self.pool)
            )
            if array.nbytes:
                # From pageable memory: staged before the call returns, then ordered on the
                # lane's stream ahead of the postprocessing kernels.
                check(
                    cudart.cudaMemcpyAsync(
                        buffer.ptr, array.ctypes.data, array.nbytes, H2D, self.stream
                    ),
                    "cudaMemcpyAsync H2D",
                )
        self.runs += 1
        return outputs

    def run(self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[Any]:
        """Host arrays in and out (the warm-up without processing)."""
        return self.inner.run(inputs, output_names)

    def terminate_runs(self) -> None:
        self.inner.terminate_runs()

    def close(self) -> None:
        self.pool.clear()
        self.inner.close()
