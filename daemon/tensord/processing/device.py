"""Processing with the CUDA kernels on a lane's stream, around a backend that runs on
device buffers (the CUDA executor's lanes).

A batch: the executor copies the uint8 images to the device -> the preprocessing kernel
writes the model input into a pooled device buffer -> the model runs on it -> the
postprocessing kernel reads the model's device outputs and writes the served ones -> the
executor copies those back. Everything is queued on the lane's stream, in order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cuda.bindings import runtime as cudart

from tensord import dtypes
from tensord.backends.base import (
    BackendPlacement,
    DeviceOptions,
    DeviceTensor,
    TensorSpec,
    release_output,
)
from tensord.cuda.memory import CudaBuffer, DevicePool, PinnedHostPool
from tensord.cuda.runtime import check
from tensord.errors import InternalError, ModelLoadError
from tensord.kernels import gpu
from tensord.kernels.gpu import DeviceArray
from tensord.kernels.image import letterbox_geometry
from tensord.processing.host import (
    ImageGeometry,
    ProcessingReport,
    check_batch,
    geometry,
    nms_settings,
)
from tensord.processing.plan import LETTERBOX_OUTPUT, NmsPlan, ProcessingPlan, TopKPlan

_ORT_TYPE = {np.dtype(np.float32): "tensor(float)", np.dtype(np.int32): "tensor(int32)"}


@dataclass(slots=True)
class DeviceOutput:
    """A served output in a pooled device buffer; the executor releases it after its copy."""

    ptr: int
    dims: tuple[int, ...]
    dtype: np.dtype
    on_release: list[Callable[[], None]] = field(default_factory=list)

    def data_ptr(self) -> int:
        return self.ptr

    def shape(self) -> tuple[int, ...]:
        return self.dims

    def data_type(self) -> str:
        return _ORT_TYPE[self.dtype]

    def release(self) -> None:
        for release in self.on_release:
            release()
        self.on_release.clear()


def families(plan: ProcessingPlan) -> set[str]:
    """The kernel families a plan needs."""
    needed = set()
    if plan.pre is not None:
        needed.add("letterbox" if plan.pre.kind == "letterbox" else "preprocess")
    if isinstance(plan.post, TopKPlan):
        needed.add("softmax_topk")
    elif isinstance(plan.post, NmsPlan):
        needed.add("nms")
    return needed


def _as_array(value: Any) -> DeviceArray:
    """A model output (OrtValue or TensorRT output) as a DeviceArray."""
    dtype = dtypes.from_ort_type(value.data_type())
    if dtype is None:
        raise InternalError(f"cannot postprocess a {value.data_type()} output")
    return DeviceArray(int(value.data_ptr()), tuple(value.shape()), np.dtype(dtype.numpy))


class DeviceProcessedBackend:
    """A lane's backend with the CUDA kernels before and after it."""

    def __init__(self, inner: Any, plan: ProcessingPlan, where: DeviceOptions) -> None:
        from tensord.kernels.driver import load_kernels

        self.inner = inner
        self.plan = plan
        self.inputs: list[TensorSpec] = plan.served_inputs
        self.outputs: list[TensorSpec] = plan.served_outputs
        self.placement: BackendPlacement = inner.placement
        self.stream = int(where.cuda_stream or 0)
        try:
            self.kernels = load_kernels(where.device_id, where.cache_directory, families(plan))
        except Exception as exc:  # NVRTC missing or failing, or the driver refusing the CUBIN
            raise ModelLoadError(
                f"the processing kernels cannot run on CUDA device {where.device_id}: {exc}; "
                'set providers = ["cpu"] in model.toml to process with the NumPy twins'
            ) from None
        self.pool = DevicePool()
        self.pinned = PinnedHostPool()
        """Staging for the few host-made values a batch uploads (the letterbox info): a copy
        from pageable memory is synchronous and would stall the lane."""
        self._pending: list[Callable[[], None]] = []
        self._taken: list[CudaBuffer] = []
        self._held: list[Any] = []
        """Consumed model outputs and host arrays still read by queued copies."""
        reason = f"CUDA kernels ({self.kernels.describe()}) on the lane's stream"
        self.processing = []
        if plan.pre is not None:
            self.processing.append(
                ProcessingReport(plan.pre.kind, "cuda", plan.pre.describe(), reason)
            )
        if plan.post is not None:
            kind = "topk" if isinstance(plan.post, TopKPlan) else "nms"
            self.processing.append(ProcessingReport(kind, "cuda", plan.post.describe(), reason))

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        raise InternalError("GPU processing runs only on the CUDA executor")

    def _take(self, shape: tuple[int, ...], dtype: np.dtype) -> CudaBuffer:
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        buffer = self.pool.acquire(nbytes)
        self._taken.append(buffer)
        return buffer

    def run_device(
        self, inputs: Mapping[str, DeviceTensor], output_names: Sequence[str]
    ) -> list[Any]:
        """Preprocess, run, postprocess on the lane's stream; served outputs in order."""
        # The executor synchronised the stream after the previous batch: its scratch is free.
        for release in self._pending:
            release()
        self._pending.clear()
        self._drop_held()
        self._taken = []
        try:
            return self._run(inputs, output_names)
        except ValueError as exc:  # a launcher refused a shape the model produced
            self._release_taken()
            raise InternalError(f"processing failed: {exc}") from exc
        except BaseException:
            self._release_taken()
            raise

    def _drop_held(self) -> None:
        """Let go of what the last batch kept alive. Model outputs from a pooled buffer (the
        native TensorRT backend's) go back to their pool: dropping them would lose a
        buffer a batch."""
        for value in self._held:
            release_output(value)
        self._held.clear()

    def _release_taken(self) -> None:
        for buffer in self._taken:
            self.pool.release(buffer)
        self._taken.clear()

    def _run(self, inputs: Mapping[str, DeviceTensor], output_names: Sequence[str]) -> list[Any]:
        feeds = dict(inputs)
        geo = self._preprocess(feeds)
        names = self.plan.model_outputs_for(output_names)
        values = dict(zip(names, self.inner.run_device(feeds, names), strict=True))
        served: dict[str, Any] = {n: v for n, v in values.items() if n in self.plan.passthrough}
        try:
            made = self._postprocess(values, geo)
        except BaseException:
            for value in values.values():  # nothing reaches the executor: give them back
                release_output(value)
            raise
        served.update(made)
        # Scratch (the model input, consumed model outputs) lives until the next batch.
        scratch = [b for b in self._taken if all(b.ptr != m.ptr for m in made.values())]
        self._pending.extend(functools.partial(self.pool.release, b) for b in scratch)
        self._held.extend(v for n, v in values.items() if n not in self.plan.passthrough)
        self._taken = []
        return [served[name] for name in output_names]

    def _preprocess(self, feeds: dict[str, DeviceTensor]) -> ImageGeometry | None:
        pre = self.plan.pre
        if pre is None:
            return None
        images = feeds.pop(pre.served.name)
        check_batch(pre, images.shape)
        n, h, w, _ = images.shape
        shape = pre.model_shape(n)
        out = DeviceArray(self._take(shape, pre.dtype).ptr, shape, pre.dtype)
        src = DeviceArray(images.ptr, tuple(images.shape), np.dtype(np.uint8))
        if pre.kind == "letterbox":
            geo = letterbox_geometry(h, w, pre.height, pre.width)
            gpu.letterbox(
                self.kernels, self.stream, src, out, pre.norm, geo, pre.pad_value, pre.layout
            )
        else:
            gpu.resize_normalize(self.kernels, self.stream, src, out, pre.norm, pre.layout)
        onnx_type = dtypes.ONNX_TYPES[dtypes.from_numpy(pre.dtype)]
        feeds[pre.model_input.name] = DeviceTensor(out.ptr, onnx_type, shape)
        return geometry(pre, h, w, n)

    def _output(self, shape: tuple[int, ...], dtype: type) -> tuple[DeviceOutput, DeviceArray]:
        dt = np.dtype(dtype)
        buffer = self._take(shape, dt)
        out = DeviceOutput(buffer.ptr, shape, dt, [lambda: self.pool.release(buffer)])
        return out, DeviceArray(buffer.ptr, shape, dt)

    def _postprocess(
        self, values: Mapping[str, Any], geo: ImageGeometry | None
    ) -> dict[str, DeviceOutput]:
        made: dict[str, DeviceOutput] = {}
        post = self.plan.post
        if isinstance(post, TopKPlan) and post.model_output in values:
            logits = _as_array(values[post.model_output])
            rows = logits.shape[0]
            made["classes"], index = self._output((rows, post.k), np.int32)
            made["scores"], value = self._output((rows, post.k), np.float32)
            gpu.softmax_topk(self.kernels, self.stream, logits, post.k, post.softmax, index, value)
        elif isinstance(post, NmsPlan) and post.boxes in values and post.scores in values:
            boxes, scores = _as_array(values[post.boxes]), _as_array(values[post.scores])
            n, d = boxes.shape[0], post.settings.max_detections
            made["boxes"], ob = self._output((n, d, 4), np.float32)
            made["scores"], os_ = self._output((n, d), np.float32)
            made["classes"], oc = self._output((n, d), np.int32)
            made["num_detections"], count = self._output((n,), np.int32)
            settings = nms_settings(post, geo)
            gpu.nms(self.kernels, self.stream, boxes, scores, settings, ob, os_, oc, count)
        if geo is not None and self.plan.pre is not None and self.plan.pre.kind == "letterbox":
            info = np.ascontiguousarray(geo.info, dtype=np.float32)
            made[LETTERBOX_OUTPUT], dev = self._output(info.shape, np.float32)
            if info.nbytes:
                self._upload(dev.ptr, info)
        return made

    def _upload(self, device_ptr: int, array: np.ndarray) -> None:
        """Copy a small host array to the device on the lane's stream, through a pinned
        buffer that goes back to its pool once the batch's stream has synchronised."""
        staging = self.pinned.acquire(array.nbytes)
        self._pending.append(functools.partial(self.pinned.release, staging))
        staging.view(array.dtype, array.shape)[...] = array
        check(
            cudart.cudaMemcpyAsync(
                device_ptr, staging.ptr, array.nbytes,
                cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream,
            ),
            "cudaMemcpyAsync H2D (letterbox)",
        )  # fmt: skip

    def terminate_runs(self) -> None:
        """Cut the model's runs in progress short."""
        self.inner.terminate_runs()

    def close(self) -> None:
        """Free the scratch buffers and close the model."""
        for release in self._pending:
            release()
        self._pending.clear()
        self._drop_held()
        self.pool.clear()
        self.pinned.clear()
        self.inner.close()
