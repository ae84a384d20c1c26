"""Which executor a model gets, and why (reported in Info and the start-up log)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import structlog

from tensord.backends.base import Backend, DeviceOptions, TensorSpec
from tensord.devices import GpuReport, probe_gpus
from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.executor.base import Executor
from tensord.executor.cpu import CpuExecutor

log = structlog.get_logger("tensord.executor")

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


def lanes_disagree(probe: str, lanes: Sequence[str]) -> str:
    """Why lane sessions cannot serve as the CUDA executor's, or "" when they can.

    The executor is chosen from the model's first session, but each lane opens its own on
    its stream, and ONNX Runtime may start one of them on another provider (the CPU, after
    a device provider failed for that lane alone): the CUDA executor would then hand device
    pointers to a session that reads host memory. Every lane must run where the first
    session ran."""
    for index, provider in enumerate(lanes):
        if provider != probe:
            return (
                f"lane {index}'s session started on {provider}, not on {probe} as the "
                "model's first session did"
            )
    return ""


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
    provider = backend.placement.provider
    kind, reason = executor_choice(provider, probe_gpus(), [*backend.inputs, *backend.outputs])
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
        why = lanes_disagree(provider, [b.placement.provider for b in executor.lane_backends])
        if not why:
            return executor, executor.primary_backend
        executor.close()
        log.warning("executor.lanes_disagree", model=name, reason=why)
        backend = make_backend(where)  # no lane stream: ONNX Runtime copies batches itself
        reason = f"{why}; batches stay in host memory"
        kind = "cpu"
    return CpuExecutor(name, backend, lanes(kind), reason), backend
