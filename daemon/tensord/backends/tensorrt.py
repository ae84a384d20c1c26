"""The native TensorRT backend: an engine built from the ONNX file, cached on disk.

The engine is built with FP16/INT8 flags and one optimisation profile per lane (min/opt/max
batch from model.toml), with a persistent timing cache. The serialized engine is cached
under `cache_directory/tensorrt/engines`, keyed by the model's hash, the TensorRT version,
the GPU name, the build flags and the lane count. The lanes of one model share one
deserialised engine (`SharedEngines`); each lane has its own execution context on its own
profile (with dynamic shapes, a profile serves one context at a time), and runs on its
lane's stream with `set_tensor_address` + `execute_async_v3`.

`tensorrt` cannot be installed on many hosts: the backend is optional, and Info and the
load error say whether it is there and why not.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensord.backends.base import (
    BackendPlacement,
    DeviceOptions,
    DeviceTensor,
    PooledOutput,
    TensorSpec,
)
from tensord.dtypes import DType
from tensord.errors import InternalError, ModelLoadError
from tensord.files import write_atomically
from tensord.modelconfig.model import ModelConfig, TensorRTConfig

PROVIDER = "TensorRT (native)"


def tensorrt_status() -> tuple[bool, str]:
    """Whether the tensorrt module imports here, and its version or the reason it does not."""
    try:
        import tensorrt
    except Exception as exc:  # ImportError, or a broken install missing its libraries
        return False, f"the tensorrt Python package is not usable here ({exc})"
    return True, f"TensorRT {tensorrt.__version__}"


def engine_key(
    model_bytes: bytes,
    trt_version: str,
    gpu_name: str,
    trt: TensorRTConfig,
    calibration: bytes = b"",
    profiles: int = 1,
) -> str:
    """The engine cache key: model hash, TensorRT version, GPU, every build flag, the
    number of optimisation profiles (one per lane), and for INT8 the calibration data
    itself (a new file under the same name builds anew)."""
    digest = hashlib.sha256(model_bytes)
    for part in (trt_version, gpu_name, trt.model_dump_json(), f"profiles={profiles}"):
        digest.update(b"\0" + part.encode())
    if calibration:
        digest.update(b"\0calibration\0" + hashlib.sha256(calibration).digest())
    return digest.hexdigest()[:32]


def check_int8(config: ModelConfig, model_dir: Path) -> Path | None:
    """INT8 needs a calibration .npy named in model.toml; refuse clearly without one."""
    trt = config.tensorrt
    if not trt.int8:
        return None
    if trt.calibration_file is None:
        raise ModelLoadError(
            "tensorrt.int8 = true needs tensorrt.calibration_file: a .npy of representative "
            "inputs (first dimension = samples) beside model.toml"
        )
    path = model_dir / trt.calibration_file
    if not path.is_file():
        raise ModelLoadError(f"tensorrt.calibration_file {path} does not exist")
    return path


_DTYPES = {
    "FLOAT": DType.FLOAT32, "HALF": DType.FLOAT16, "BF16": DType.BFLOAT16, "INT8": DType.INT8,
    "INT32": DType.INT32, "INT64": DType.INT64, "BOOL": DType.BOOL, "UINT8": DType.UINT8,
}  # fmt: skip


class SharedEngines:
    """Deserialised engines shared by the lanes of a model: the first lane loads one, the
    others take it with the next free optimisation profile; the last to leave drops it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[Any, list[int]]] = {}
        """key -> (what load() returned, the profiles in use)."""

    def acquire(self, key: str, load: Any, profiles: int) -> tuple[Any, int]:
        """(the loaded engine, a profile index of its own) for one lane; `load()` runs only
        for the first. RuntimeError when every profile is taken."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = (load(), [])
                self._entries[key] = entry
            loaded, used = entry
            free = next((i for i in range(profiles) if i not in used), None)
            if free is None:
                raise RuntimeError(f"all {profiles} optimisation profiles of the engine are taken")
            used.append(free)
            return loaded, free

    def release(self, key: str, profile: int) -> None:
        """A lane is done with its profile; the engine goes with the last one."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry[1].remove(profile)
            if not entry[1]:
                del self._entries[key]


ENGINES = SharedEngines()


class TensorRTBackend:
    """A shared engine, and this lane's execution context and profile on its stream."""

    def __init__(self, path: Path, config: ModelConfig, where: DeviceOptions) -> None:
        available, why = tensorrt_status()
        if not available:
            raise ModelLoadError(f'backend = "tensorrt" cannot load: {why}')
        if where.cuda_stream is None:
            raise ModelLoadError("the native TensorRT backend needs a CUDA device and stream")
        import tensorrt as trt

        from tensord.cuda.memory import DevicePool
        from tensord.devices import probe_gpus

        self._trt = trt
        self._stream = where.cuda_stream
        self._logger = trt.Logger(trt.Logger.WARNING)
        gpus = probe_gpus().gpus
        gpu = gpus[where.device_id].name if where.device_id < len(gpus) else "unknown GPU"
        self._profiles = config.instances_on("cuda")
        cache = where.cache_directory / "tensorrt"
        self._key, engine_bytes = self._engine(path, config, cache, gpu)

        def load() -> tuple[Any, Any]:
            # The runtime must outlive the engines it deserializes: keep it with the engine.
            runtime = trt.Runtime(self._logger)
            engine = runtime.deserialize_cuda_engine(engine_bytes)
            if engine is None:
                raise ModelLoadError(f"TensorRT could not deserialize the engine for {path}")
            return runtime, engine

        try:
            (self._runtime, self._engine_obj), self._profile = ENGINES.acquire(
                self._key, load, self._profiles
            )
        except RuntimeError as exc:
            raise ModelLoadError(f"TensorRT engine for {path}: {exc}") from None
        try:
            self._context = self._engine_obj.create_execution_context()
            if self._profile:
                self._context.set_optimization_profile_async(self._profile, self._stream)
        except BaseException:
            ENGINES.release(self._key, self._profile)
            raise
        self._outputs_pool = DevicePool()
        self._lock = threading.Lock()
        self.inputs, self.outputs = self._signature()
        self.placement = BackendPlacement(
            "tensorrt", PROVIDER, f'backend = "tensorrt" in model.toml; {why} on {gpu}', (PROVIDER,)
        )

    def _engine(self, path: Path, config: ModelConfig, cache: Path, gpu: str) -> tuple[str, bytes]:
        """The engine's cache key and its serialized bytes (built when not cached)."""
        model_bytes = path.read_bytes()
        # path is <model>/<version>/model.onnx; the calibration file sits beside model.toml.
        calibration = check_int8(config, path.parent.parent)
        key = engine_key(
            model_bytes,
            self._trt.__version__,
            gpu,
            config.tensorrt,
            calibration.read_bytes() if calibration is not None else b"",
            self._profiles,
        )
        cached = cache / "engines" / f"{key}.engine"
        if cached.is_file():
            return key, cached.read_bytes()
        engine = self._build(model_bytes, config, path, cache / "timing.cache", calibration)
        write_atomically(cached, engine)
        return key, engine

    def _build(
        self,
        model_bytes: bytes,
        config: ModelConfig,
        path: Path,
        timing: Path,
        calibration: Path | None,
    ) -> bytes:
        trt = self._trt
        builder = trt.Builder(self._logger)
        # TensorRT 10 networks are always explicit-batch (the flag is deprecated and
        # ignored); before 10, flags 0 means implicit batch, which the ONNX parser refuses.
        flags = 0
        if int(trt.__version__.split(".")[0]) < 10:
            flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self._logger)
        # The path lets the parser find weights stored outside the .onnx file.
        if not parser.parse(model_bytes, str(path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise ModelLoadError(f"TensorRT cannot parse the ONNX model: {errors}")
        build = builder.create_builder_config()
        options = config.tensorrt
        if options.fp16:
            build.set_flag(trt.BuilderFlag.FP16)
        calibrator = None
        if calibration is not None:
            if network.num_inputs != 1:
                raise ModelLoadError(
                    f"tensorrt.calibration_file feeds one input; the model has {network.num_inputs}"
                )
            samples = _calibration_samples(
                trt, np.load(calibration), network.get_input(0), options.opt_batch
            )
            build.set_flag(trt.BuilderFlag.INT8)
            calibrator = _calibrator(trt, samples, options.opt_batch)
            build.int8_calibrator = calibrator
        try:
            return self._build_engine(builder, network, build, options, timing)
        finally:
            if calibrator is not None:
                calibrator.free()

    def _build_engine(
        self, builder: Any, network: Any, build: Any, options: TensorRTConfig, timing: Path
    ) -> bytes:
        for _ in range(self._profiles):  # one per lane: a profile serves one context at once
            profile = builder.create_optimization_profile()
            for i in range(network.num_inputs):
                tensor = network.get_input(i)
                rest = tuple(tensor.shape)[1:]
                if any(d < 0 for d in rest):
                    raise ModelLoadError(
                        f"input {tensor.name!r} has dynamic non-batch dimensions "
                        f"{tuple(tensor.shape)}; the TensorRT profile varies the batch only"
                    )
                profile.set_shape(
                    tensor.name,
                    (options.min_batch, *rest),
                    (options.opt_batch, *rest),
                    (options.max_batch, *rest),
                )
            build.add_optimization_profile(profile)
        cache = build.create_timing_cache(timing.read_bytes() if timing.is_file() else b"")
        build.set_timing_cache(cache, ignore_mismatch=False)
        serialized = builder.build_serialized_network(network, build)
        if serialized is None:
            raise ModelLoadError("TensorRT failed to build an engine (see its log above)")
        write_atomically(timing, bytes(build.get_timing_cache().serialize()))
        return bytes(serialized)

    def _signature(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        trt, engine = self._trt, self._engine_obj
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            kind = _DTYPES.get(engine.get_tensor_dtype(name).name)
            if kind is None:
                raise ModelLoadError(f"tensor {name!r} has a TensorRT type tensord cannot carry")
            spec = TensorSpec(name, kind, tuple(int(d) for d in engine.get_tensor_shape(name)))
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (inputs if is_input else outputs).append(spec)
        return inputs, outputs

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        raise InternalError("the native TensorRT backend runs only on the CUDA executor")

    def run_device(
        self, inputs: Mapping[str, DeviceTensor], output_names: Sequence[str]
    ) -> list[PooledOutput]:
        """Bind device buffers, enqueue with execute_async_v3 on the lane's stream."""
        context = self._context
        with self._lock:  # one context: one enqueue at a time (each lane has its own backend)
            for name, tensor in inputs.items():
                if not context.set_input_shape(name, tensor.shape):
                    raise InternalError(
                        f"TensorRT refused shape {tensor.shape} for {name!r}: outside the "
                        "engine's optimisation profile (tensorrt.min_batch/max_batch)"
                    )
                context.set_tensor_address(name, tensor.ptr)
            outputs: list[PooledOutput] = []
            specs = {s.name: s for s in self.outputs}
            try:
                for name in output_names:
                    dims = tuple(int(d) for d in context.get_tensor_shape(name))
                    dtype = specs[name].dtype
                    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.numpy.itemsize
                    buffer = self._outputs_pool.acquire(max(nbytes, 1))
                    outputs.append(PooledOutput(buffer, dims, dtype, self._outputs_pool))
                    context.set_tensor_address(name, buffer.ptr)
                if not context.execute_async_v3(self._stream):
                    raise InternalError("TensorRT execute_async_v3 failed (see its log)")
            except BaseException:
                for out in outputs:  # an out-of-memory acquire, or a failed launch
                    out.release()
                raise
        return outputs

    def terminate_runs(self) -> None:
        """An enqueued TensorRT execution cannot be stopped midway: it finishes."""

    def close(self) -> None:
        """Drop the context and this lane's hold on the shared engine; free the output
        buffers."""
        self._context = None
        self._engine_obj = None
        self._runtime = None
        ENGINES.release(self._key, self._profile)
        self._outputs_pool.clear()


def _calibration_samples(trt: Any, samples: np.ndarray, tensor: Any, batch: int) -> np.ndarray:
    """The calibration samples as the network input's dtype, checked against its shape:
    TensorRT reads each batch's bytes as they are."""
    want = tuple(int(d) for d in tuple(tensor.shape)[1:])
    if tuple(samples.shape[1:]) != want:
        raise ModelLoadError(
            f"tensorrt.calibration_file: samples of shape {list(samples.shape[1:])}, but input "
            f"{tensor.name!r} takes {list(want)} per sample"
        )
    if len(samples) < batch:
        raise ModelLoadError(
            f"tensorrt.calibration_file holds {len(samples)} samples, fewer than one batch of "
            f"tensorrt.opt_batch = {batch}"
        )
    dtype = np.dtype(trt.nptype(tensor.dtype))
    if samples.dtype.kind not in "biuf":
        raise ModelLoadError(
            f"tensorrt.calibration_file holds {samples.dtype} values; input {tensor.name!r} "
            f"takes {dtype}"
        )
    return np.ascontiguousarray(samples.astype(dtype, copy=False))


def _calibrator(trt: Any, samples: np.ndarray, batch: int) -> Any:
    """An entropy calibrator feeding the .npy samples in batches through device memory."""
    from cuda.bindings import runtime as cudart

    from tensord.cuda.runtime import check

    samples = np.ascontiguousarray(samples)

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            super().__init__()
            self.index = 0
            self.nbytes = samples[:batch].nbytes
            self.device = check(cudart.cudaMalloc(self.nbytes), "cudaMalloc")

        def get_batch_size(self) -> int:
            return batch

        def get_batch(self, names: list[str]) -> list[int] | None:
            if self.index + batch > len(samples):
                return None
            chunk = samples[self.index : self.index + batch]
            kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
            check(
                cudart.cudaMemcpy(self.device, chunk.ctypes.data, chunk.nbytes, kind), "cudaMemcpy"
            )
            self.index += batch
            return [int(self.device)]

        def read_calibration_cache(self) -> bytes | None:
            return None

        def write_calibration_cache(self, cache: bytes) -> None:
            return None

        def free(self) -> None:
            """Free the batch buffer once the build has finished calibrating."""
            if self.device is not None:
                check(cudart.cudaFree(self.device), "cudaFree")
                self.device = None

    return Calibrator()
