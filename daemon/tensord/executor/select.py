"""Which executor a model gets, and why (reported in Info and the start-up log)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from tensord.backends.base import Backend, DeviceOptions, TensorSpec
from tensord.devices import GpuReport, probe_gpus
from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.executor.base import Executor
from tensord.executor.cpu import CpuExecutor

# Providers whose sessions run on a CUDA device and accept device buffers: ONNX Runtime's
# (IOBinding), and "CUDA" for a backend that launches its own kernels on the lane's stream.
CUDA_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider", "CUDA"})


def executor_choice(provider: str, gpus: GpuReport, specs: Sequence[TensorSpec]) -> tuple[str, str]:
    """(kind, reason) for a model whose backend session runs on `provider`."""
    if provider not in CUDA_PROVIDERS:
        return "cpu", f"the model runs on {provider}, so its batches stay in host memory"
    if not gpus.gpus:
        return "cpu", f"no usable CUDA device ({gpus.unavailable_reason})"
    if any(spec.dtype is DType.STRING for spec in specs):
        return "cpu", "string tensors live in host memory; ONNX Runtime copies the rest itself"
    return "cuda", f"{provider} on {gpus.gpus[0].name}: batches are pipelined over CUDA streams"


def build_tensorrt_executor(
    name: str, make_backend: Callable[[DeviceOptions], Backend], lanes: int, where: DeviceOptions
) -> tuple[Executor, Backend]:
    """Native TensorRT engines run only on the CUDA executor: one engine context per lane."""
    from tensord.backends.tensorrt import tensorrt_status

    gpus = probe_gpus()
    if not gpus.gpus:
        raise ModelLoadError(f'backend = "tensorrt" needs a CUDA device: {gpus.unavailable_reason}')
    available, why = tensorrt_status()
    if not available:
        raise ModelLoadError(f'backend = "tensorrt" cannot load: {why}')
    from tensord.executor.cuda.executor import CudaExecutor

    executor = CudaExecutor(
        name,
        lambda stream: make_backend(replace(where, cuda_stream=stream)),
        lanes,
        where.device_id,
        f"native TensorRT engines run on CUDA streams ({why})",
    )
    return executor, executor.primary_backend


def build_executor(
    name: str,
    backend: Backend,
    make_backend: Callable[[DeviceOptions], Backend],
    lanes: Callable[[str], int],
    where: DeviceOptions,
) -> tuple[Executor, Backend]:
    """The executor for a loaded backend, and the backend that now describes the model;
    `lanes` gives its lane count from the executor's kind.

    The CUDA executor needs one session per lane, each on its lane's stream, so the probe
    session is closed and replaced by lane sessions.
    """
    kind, reason = executor_choice(
        backend.placement.provider, probe_gpus(), [*backend.inputs, *backend.outputs]
    )
    if kind == "cuda":
        from tensord.executor.cuda.executor import CudaExecutor

        backend.close()
        executor = CudaExecutor(
            name,
            lambda stream: make_backend(replace(where, cuda_stream=stream)),
            lanes(kind),
            where.device_id,
            reason,
        )
        return executor, executor.primary_backend
    return CpuExecutor(name, backend, lanes(kind), reason), backend
