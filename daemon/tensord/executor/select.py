"""Which executor a model gets, and why (reported in Info and the start-up log)."""

from __future__ import annotations

from tensord.devices import GpuReport

# Providers whose sessions run on a CUDA device.
CUDA_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})


def executor_choice(provider: str, gpus: GpuReport) -> tuple[str, str]:
    """(kind, reason) for a model whose backend runs on `provider`."""
    if provider not in CUDA_PROVIDERS:
        return "cpu", f"the model runs on {provider}, so its batches stay in host memory"
    if not gpus.gpus:
        return "cpu", f"no usable CUDA device ({gpus.unavailable_reason})"
    return "cpu", (
        f"{provider} copies between host and device itself; the stream-pipelined CUDA "
        "executor is not part of this build"
    )
