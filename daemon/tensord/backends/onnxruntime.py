"""ONNX Runtime backend: one InferenceSession per model version, server-fit options."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import structlog

from tensord import dtypes
from tensord.backends.base import BackendPlacement, DeviceOptions, DeviceTensor, TensorSpec
from tensord.backends.ort_session import (
    StrictSession,
    check_provider_options,
    prepare_cuda_libraries,
    usable_providers,
)
from tensord.backends.providers import explain_actual, plan_providers
from tensord.cuda.device_fault import sticky_error_in
from tensord.dtypes import DType
from tensord.errors import (
    DeviceLostError,
    InternalError,
    ModelLoadError,
    OutOfMemoryError,
    UnavailableError,
)
from tensord.modelconfig.model import ModelConfig

log = structlog.get_logger("tensord.backends")

# Azure's provider calls a remote endpoint instead of running the graph here.
_NOT_LOCAL = frozenset({"AzureExecutionProvider"})


def available_providers() -> list[str]:
    """The execution providers this ONNX Runtime build offers for local execution (a CUDA
    build's libraries loaded first, so that what it lists can start)."""
    if getattr(ort, "cuda_version", ""):
        prepare_cuda_libraries()
    return [p for p in ort.get_available_providers() if p not in _NOT_LOCAL]


# How ONNX Runtime's allocators (CPU arena, CUDA, TensorRT) word an allocation failure.
_OOM_MARKERS = (
    "Failed to allocate memory",
    "out of memory",
    "bad_alloc",
    "CUDNN_STATUS_ALLOC_FAILED",
)
# What a run cut short by RunOptions.terminate raises.
_TERMINATED_MARKER = "terminate flag"
_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16


def _to_numpy(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype=DType.BFLOAT16.numpy)
    buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    bits = np.ctypeslib.as_array(buffer).copy()  # copy: the OrtValue owns that memory
    return bits.view(DType.BFLOAT16.numpy).reshape(shape)


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
            raise ModelLoadError(
                f"{what} {arg.name!r} has type {arg.type}, which tensord cannot carry"
            )
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
        specs.append(TensorSpec(arg.name, dtype, shape))
    return specs


def _mark_unknown_ranks(
    path: Path, inputs: list[TensorSpec], outputs: list[TensorSpec]
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """ONNX Runtime reports a tensor with no shape in the graph as rank 0, like a scalar;
    the graph (read without its external weights) tells the two apart."""
    import onnx  # only for models with rank-0 tensors: scalars, or no shape at all

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # ONNX Runtime loaded it; keep what it said
        return inputs, outputs
    shapeless = {
        value.name
        for value in (*graph.input, *graph.output)
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape")
    }

    def mark(specs: list[TensorSpec]) -> list[TensorSpec]:
        return [
            replace(spec, rank_known=False) if not spec.shape and spec.name in shapeless else spec
            for spec in specs
        ]

    return mark(inputs), mark(outputs)


def provider_options(
    providers: Sequence[str], config: ModelConfig, where: DeviceOptions
) -> list[tuple[str, dict[str, str]]]:
    """Each provider with its options: device, the lane's compute stream, TensorRT caches."""
    result = []
    for name in providers:
        options: dict[str, str] = {}
        if name in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
            options["device_id"] = str(where.device_id)
            if where.cuda_stream is not None:
                options["user_compute_stream"] = str(where.cuda_stream)
                if name == "CUDAExecutionProvider":
                    # The CUDA provider's own flag; the TensorRT provider's Python options
                    # parser knows only user_compute_stream, which implies it.
                    options["has_user_compute_stream"] = "1"
        if name == "CUDAExecutionProvider":
            # ONNX Runtime's CUDA provider uses TF32 for float32 unless told otherwise.
            options["use_tf32"] = "1" if config.cuda_tf32 else "0"
        if name == "TensorrtExecutionProvider":
            # The Python binding parses the TensorRT provider's flags itself and takes only
            # "True"/"true"/"False"/"false" for them ("1" fails the session's creation).
            trt = config.tensorrt
            cache = str(where.cache_directory / "tensorrt")
            options["trt_fp16_enable"] = "True" if trt.fp16 else "False"
            if trt.engine_cache:
                options.update(trt_engine_cache_enable="True", trt_engine_cache_path=cache)
            if trt.timing_cache:
                options.update(trt_timing_cache_enable="True", trt_timing_cache_path=cache)
        result.append((name, options))
    return result


def _open_session(
    path: Path,
    model: bytes | None,
    options: ort.SessionOptions,
    requested: list[tuple[str, dict[str, str]]],
) -> tuple[ort.InferenceSession, str]:
    """A session on the requested providers, each with its options (a CUDA provider on the
    lane's stream). When the first provider fails to start, the next one is tried with the
    rest of the list (TensorRT, then CUDA, ..., then the CPU), and the reason says what
    failed. ModelLoadError when not even the CPU loads the model."""
    if model is not None:  # a rewritten graph: its external weights stay beside `path`
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(path.parent)
        )
    source = model if model is not None else str(path)
    failures: list[str] = []
    remaining = list(requested)
    while True:
        names = [name for name, _ in remaining]
        try:
            session = StrictSession(source, sess_options=options, providers=remaining)
            check_provider_options(session, remaining)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NoSuchFile types
            sticky = sticky_error_in(str(exc))
            if sticky is not None:  # the device is gone: the CPU would hide it
                raise DeviceLostError(
                    f"{names[0]} failed with {sticky} (context lost) opening {path}: {exc}"
                ) from None
            if len(remaining) == 1:
                tried = f" (after: {'; '.join(failures)})" if failures else ""
                raise ModelLoadError(f"ONNX Runtime cannot load {path}: {exc}{tried}") from None
            failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning(
                "onnxruntime.provider_failed", model_path=str(path), providers=names, error=failed
            )
            failures.append(f"{names[0]} failed to start ({failed})")
            remaining = remaining[1:]
            continue
        if not failures:
            return session, ""
        return session, f"{'; '.join(failures)}; running on {session.get_providers()[0]}"


class OnnxRuntimeBackend:
    """Runs an ONNX file with the best available provider; CPU always works.

    `model`, when given, is the serialized graph to run instead of the file's (a graph the
    loader rewrote); its external weights are still read beside `path`."""

    def __init__(
        self,
        path: Path,
        config: ModelConfig,
        where: DeviceOptions | None = None,
        model: bytes | None = None,
    ) -> None:
        plan = plan_providers(
            usable_providers(available_providers()), config.preferred_provider, config.providers
        )
        self.device_id = (where or DeviceOptions()).device_id
        requested = provider_options(plan.providers, config, where or DeviceOptions())
        self._session, reason = _open_session(path, model, session_options(config), requested)
        actual = self._session.get_providers()
        self.placement = BackendPlacement(
            backend="onnxruntime",
            provider=actual[0],
            provider_reason=reason or explain_actual(plan, actual),
            requested_providers=plan.providers,
        )
        self.inputs = describe(self._session.get_inputs(), "input")
        self.outputs = describe(self._session.get_outputs(), "output")
        if any(not spec.shape for spec in (*self.inputs, *self.outputs)):
            self.inputs, self.outputs = _mark_unknown_ranks(path, self.inputs, self.outputs)
        self._bfloat16 = any(s.dtype is DType.BFLOAT16 for s in (*self.inputs, *self.outputs))
        self._runs: set[ort.RunOptions] = set()
        """The RunOptions of the runs in progress: terminate_runs flags them."""

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        """One blocking run. Safe to call from several threads at once."""
        options = self._begin()
        try:
            if self._bfloat16:
                return self._run_ort_values(inputs, output_names, options)
            return self._session.run(list(output_names), dict(inputs), options)
        except Exception as exc:
            raise _run_error(exc) from exc
        finally:
            self._runs.discard(options)

    def _begin(self) -> ort.RunOptions:
        """A run's options, known to terminate_runs until the run ends (~1 us)."""
        options = ort.RunOptions()
        self._runs.add(options)
        return options

    def terminate_runs(self) -> None:
        """ONNX Runtime checks the flag between nodes: a run stops within one node."""
        for options in list(self._runs):  # list(): one step under the GIL
            options.terminate = True

    def run_device(
        self, inputs: Mapping[str, DeviceTensor], output_names: Sequence[str]
    ) -> list[Any]:
        """Run on device buffers through IOBinding; returns the device-resident OrtValues.

        The session was created on the lane's stream, so ONNX Runtime's kernels follow the
        copies the lane queued before this call.
        """
        binding = self._session.io_binding()
        for name, tensor in inputs.items():
            binding.bind_input(
                name, "cuda", self.device_id, tensor.onnx_type, list(tensor.shape), tensor.ptr
            )
        for name in output_names:
            binding.bind_output(name, "cuda", self.device_id)
        self.run_binding(binding)
        return list(binding.get_outputs())

    def io_binding(self) -> ort.IOBinding:
        """A fresh IOBinding on the session, for run_binding."""
        return self._session.io_binding()

    def run_binding(self, binding: ort.IOBinding) -> None:
        """One blocking run of what `binding` holds (outputs stay where they were bound)."""
        options = self._begin()
        # The graph-capture id's default, said outright: ONNX Runtime's Python wrapper
        # looks it up on every IOBinding run, and an unset key costs it a raised and caught
        # exception (~55 us a run, measured), as long as a small model's decode step.
        options.add_run_config_entry(_GPU_GRAPH_ID, "0")
        try:
            self._session.run_with_iobinding(binding, options)
        except Exception as exc:
            raise _run_error(exc) from exc
        finally:
            self._runs.discard(options)

    def _run_ort_values(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        options: ort.RunOptions,
    ) -> list[np.ndarray]:
        # ONNX Runtime's NumPy bridge has no bfloat16: pass bfloat16 tensors as OrtValues
        # holding their 16-bit patterns, and copy bfloat16 results out by pointer.
        # np.require, not np.ascontiguousarray: that one makes a 0-d array 1-d.
        feeds = {}
        for name, array in inputs.items():
            if array.dtype == DType.BFLOAT16.numpy:
                feeds[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.require(array, requirements="C").view(np.uint16),
                    onnx_element_type=_ONNX_BFLOAT16,
                )
            else:
                feeds[name] = ort.OrtValue.ortvalue_from_numpy(np.require(array, requirements="C"))
        results = self._session.run_with_ort_values(list(output_names), feeds, options)
        return [_to_numpy(value) for value in results]

    def close(self) -> None:
        """Drop the session; ONNX Runtime frees its memory when the last reference goes."""
        self._session = None


_GPU_GRAPH_ID = "gpu_graph_id"
"""The run option naming a captured graph; 0 is its default (no capture asked for)."""


def _run_error(exc: Exception) -> Exception:
    """ONNX Runtime's exception as a typed one: out of memory, a lost device, or INTERNAL."""
    text = str(exc)
    if _TERMINATED_MARKER in text:
        return UnavailableError(
            "the run was stopped: the server is shutting down and its drain grace ran out; "
            "retry on another instance"
        )
    if any(marker in text for marker in _OOM_MARKERS):
        return OutOfMemoryError(f"out of memory running the batch: {text}")
    sticky = sticky_error_in(text)
    if sticky is not None:
        return DeviceLostError(f"ONNX Runtime run failed with {sticky} (context lost): {text}")
    return InternalError(f"ONNX Runtime run failed: {text}")
