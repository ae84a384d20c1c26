"""Wrapping a model's backend in its processing, and the signature it then serves."""

from __future__ import annotations

from typing import Any

from tensord.backends.base import Backend, DeviceOptions, TensorSpec
from tensord.backends.signature import apply_overrides
from tensord.modelconfig.model import ModelConfig


def with_processing(backend: Backend, config: ModelConfig, where: DeviceOptions) -> Backend:
    """The backend itself when model.toml has no [preprocess]/[postprocess]; otherwise
    wrapped: CUDA kernels on a lane's stream, NumPy twins on host arrays."""
    if config.preprocess is None and config.postprocess is None:
        return backend
    try:
        from tensord.processing.plan import plan_processing

        plan = plan_processing(
            config.preprocess,
            config.postprocess,
            apply_overrides(backend.inputs, config.inputs, "inputs"),
            apply_overrides(backend.outputs, config.outputs, "outputs"),
        )
        assert plan is not None
        if where.cuda_stream is not None and hasattr(backend, "run_device"):
            from tensord.processing.device import DeviceProcessedBackend

            return DeviceProcessedBackend(backend, plan, where)
        from tensord.processing.host import HostProcessedBackend

        provider = backend.placement.provider
        reason = f"the model runs on {provider} with batches in host memory: NumPy twins"
        return HostProcessedBackend(backend, plan, reason)
    except BaseException:
        backend.close()
        raise


def served_signature(
    backend: Any, config: ModelConfig
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs and outputs Predict serves: the processed ones, or the model's own
    narrowed by model.toml's overrides."""
    plan = getattr(backend, "plan", None)
    if plan is not None:
        return list(plan.served_inputs), list(plan.served_outputs)
    return (
        apply_overrides(backend.inputs, config.inputs, "inputs"),
        apply_overrides(backend.outputs, config.outputs, "outputs"),
    )
