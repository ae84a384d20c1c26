"""The data plane: what each RPC does, in domain types. The servicer only converts.

The same data plane could serve another transport; nothing here knows protobuf.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import numpy as np

from tensord import __version__
from tensord.access import check_model
from tensord.devices import CpuReport, GpuReport, probe_cpu, probe_gpus
from tensord.errors import UnavailableError, UnimplementedError
from tensord.executor.split import run_splitting_on_oom
from tensord.predict.validation import check_inputs, check_output_names
from tensord.registry.registry import ModelRegistry, ModelState, ModelVersion


@dataclass(slots=True)
class PredictCall:
    """A Predict request after decoding."""

    model: str
    version: int
    inputs: list[tuple[str, np.ndarray]]
    output_names: list[str]
    deadline: float | None
    """time.monotonic() by which the answer is due, or None."""


@dataclass(slots=True)
class PredictResult:
    """A Predict answer before encoding."""

    model: str
    version: int
    outputs: list[tuple[str, np.ndarray]]
    queue_s: float
    compute_s: float


@dataclass(slots=True)
class HealthReport:
    """Overall serving state and the versions reported."""

    serving: bool
    models: list[ModelVersion]


@dataclass(slots=True)
class ServerInfo:
    """Everything Info reports."""

    version: str
    runtime: dict[str, str]
    cpu: CpuReport
    gpu: GpuReport
    available_providers: list[str]
    tensorrt: str
    models: list[ModelVersion]


class DataPlane:
    """Predict, Generate, Health and Info over a model registry."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.serving = False
        """True once the models are loaded, False again while draining."""

    async def predict(self, call: PredictCall) -> PredictResult:
        """Validate against the signature, queue, run, and return the asked-for outputs."""
        self._check_serving()
        check_model(call.model)
        entry = self.registry.get(call.model, call.version)
        inputs = check_inputs(entry.name, entry.inputs, call.inputs, entry.config.max_batch_size)
        names = check_output_names(entry.name, entry.outputs, call.output_names)
        executor = entry.executor
        if executor is None or entry.state is not ModelState.READY:  # unloaded between get and run
            raise UnavailableError(
                f"model {entry.name!r} version {entry.version} is {entry.state.name}"
            )
        if entry.batcher is not None:
            result = await entry.batcher.submit(inputs, names, call.deadline)
        else:
            result = await run_splitting_on_oom(executor.run, [inputs], names, call.deadline)
        return PredictResult(
            entry.name,
            entry.version,
            list(zip(names, result.outputs, strict=True)),
            result.queue_s,
            result.compute_s,
        )

    async def generate(self, model: str, version: int) -> None:
        """Not built yet: answer UNIMPLEMENTED once the model is known."""
        self._check_serving()
        check_model(model)
        self.registry.get(model, version)
        raise UnimplementedError(
            "Generate is not available in this tensord version: the generation engine "
            "(continuous batching over a paged KV cache) is not built yet; use Predict"
        )

    def health(self, model: str = "") -> HealthReport:
        """Serving state and every version, or one model's versions (NOT_FOUND if unknown)."""
        if model:
            return HealthReport(self.serving, self.registry.get_versions(model))
        return HealthReport(self.serving, self.registry.versions())

    def info(self) -> ServerInfo:
        """The server, its devices and providers, and every model version."""
        import grpc
        import onnxruntime
        from google.protobuf import __version__ as protobuf_version

        from tensord.backends.onnxruntime import available_providers
        from tensord.backends.tensorrt import tensorrt_status

        runtime = {
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__,
            "grpcio": grpc.__version__,
            "protobuf": protobuf_version,
            "numpy": np.__version__,
        }
        return ServerInfo(
            __version__,
            runtime,
            probe_cpu(),
            probe_gpus(),
            available_providers(),
            tensorrt_status()[1],
            self.registry.versions(),
        )

    def _check_serving(self) -> None:
        if not self.serving:
            raise UnavailableError("the server is starting or draining; retry shortly")
