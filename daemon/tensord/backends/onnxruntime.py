"""ONNX Runtime backend: one InferenceSession per model version, server-fit options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from tensord import dtypes
from tensord.backends.base import BackendPlacement, TensorSpec
from tensord.backends.providers import explain_actual, plan_providers
from tensord.errors import InternalError, ModelLoadError
from tensord.registry.model_config import ModelConfig


# Azure's provider calls a remote endpoint instead of running the graph here.
_NOT_LOCAL = frozenset({"AzureExecutionProvider"})


def available_providers() -> list[str]:
    """The execution providers this ONNX Runtime build offers for local execution."""
    return [p for p in ort.get_available_providers() if p not in _NOT_LOCAL]


def session_options(config: ModelConfig) -> ort.SessionOptions:
    """Options for a server: bounded threads, no spinning by default, full optimisation."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = config.intra_op_threads
    opts.inter_op_num_threads = config.inter_op_threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    spin = "1" if config.allow_spinning else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spin)
    opts.log_severity_level = 3
    return opts


def describe(args: Sequence[Any], what: str) -> list[TensorSpec]:
    """TensorSpecs from ONNX Runtime's NodeArg list; symbolic or missing dims become -1."""
    specs = []
    for arg in args:
        dtype = dtypes.from_ort_type(arg.type)
        if dtype is None:
            raise ModelLoadError(f"{what} {arg.name!r} has type {arg.type}, which tensord cannot carry")
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
        specs.append(TensorSpec(arg.name, dtype, shape))
    return specs


class OnnxRuntimeBackend:
    """Runs an ONNX file with the best available provider; CPU always works."""

    def __init__(self, path: Path, config: ModelConfig) -> None:
        plan = plan_providers(available_providers(), config.preferred_provider, config.providers)
        try:
            self._session = ort.InferenceSession(
                str(path), sess_options=session_options(config), providers=list(plan.providers)
            )
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NoSuchFile types
            raise ModelLoadError(f"ONNX Runtime cannot load {path}: {exc}") from None
        actual = self._session.get_providers()
        self.placement = BackendPlacement(
            backend="onnxruntime",
            provider=actual[0],
            provider_reason=explain_actual(plan, actual),
            requested_providers=plan.providers,
            executor="cpu",
        )
        self.inputs = describe(self._session.get_inputs(), "input")
        self.outputs = describe(self._session.get_outputs(), "output")

    def run(self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """One blocking run. Safe to call from several threads at once."""
        try:
            return self._session.run(list(output_names), dict(inputs))  # type: ignore[no-any-return]
        except Exception as exc:
            raise InternalError(f"ONNX Runtime run failed: {exc}") from exc

    def close(self) -> None:
        """Drop the session; ONNX Runtime frees its memory when the last reference goes."""
        self._session = None  # type: ignore[assignment]
