"""Processing with the NumPy twins, around a backend that runs on host arrays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tensord.backends.base import Backend, BackendPlacement, TensorSpec
from tensord.errors import InternalError, InvalidArgumentError
from tensord.kernels import classify, image
from tensord.kernels.nms import NmsSettings
from tensord.kernels.nms import nms as nms_twin
from tensord.processing.plan import (
    LETTERBOX_OUTPUT,
    ImagePlan,
    NmsPlan,
    PoolPlan,
    ProcessingPlan,
    TopKPlan,
)
from tensord.processing.pooling import pool


@dataclass(slots=True, frozen=True)
class ProcessingReport:
    """What one processing step does and where it runs, for Info and the log."""

    kind: str
    """resize, letterbox, topk or nms."""
    device: str
    """"cuda" (the CUDA kernels) or "cpu" (the NumPy twins)."""
    description: str
    reason: str


@dataclass(slots=True)
class ImageGeometry:
    """Per batch: where the image landed in the model input (model = source * s + o)."""

    info: np.ndarray
    """float32 [N, 4]: scale_x, scale_y, offset_x, offset_y."""


def check_batch(plan: ImagePlan, shape: tuple[int, ...]) -> None:
    """INVALID_ARGUMENT unless the images are [N, H, W, 3] with 1 <= H, W <= the limit."""
    name = plan.served.name
    if len(shape) != 4 or shape[3] != 3:
        raise InvalidArgumentError(
            f"input {name!r}: images must be uint8 [N, H, W, 3], got {list(shape)}"
        )
    _, h, w, _ = shape
    if not (1 <= h <= plan.max_image_size and 1 <= w <= plan.max_image_size):
        raise InvalidArgumentError(
            f"input {name!r}: image size {h}x{w} is outside 1..{plan.max_image_size} pixels "
            "per side (preprocess.max_image_size)"
        )


def geometry(plan: ImagePlan, src_h: int, src_w: int, n: int) -> ImageGeometry:
    """The source -> model coordinate map for a batch of src_h x src_w images."""
    if plan.kind == "letterbox":
        one = image.letterbox_geometry(src_h, src_w, plan.height, plan.width).info(src_h, src_w)
    else:
        one = np.array([plan.width / src_w, plan.height / src_h, 0, 0], dtype=np.float32)
    return ImageGeometry(np.tile(one, (n, 1)))


def preprocess_host(plan: ImagePlan, images: np.ndarray) -> np.ndarray:
    """The model input for a batch of images (NumPy twin)."""
    check_batch(plan, images.shape)
    if plan.kind == "letterbox":
        out, _ = image.letterbox(
            images, plan.height, plan.width, plan.norm, plan.pad_value, plan.dtype, plan.layout
        )
        return out
    return image.resize_normalize(
        images, plan.height, plan.width, plan.norm, plan.dtype, plan.layout
    )


def nms_settings(plan: NmsPlan, geo: ImageGeometry | None) -> NmsSettings:
    """The plan's settings, mapping boxes back to source pixels when asked to."""
    s = plan.settings
    if geo is None or not plan.source_coordinates or len(geo.info) == 0:
        return s
    sx, sy, ox, oy = (float(v) for v in geo.info[0])
    return NmsSettings(
        s.score_threshold, s.iou_threshold, s.max_detections, s.max_candidates, s.box_format,
        (ox, oy), (sx, sy),
    )  # fmt: skip


def postprocess_host(
    plan: ProcessingPlan,
    outputs: Mapping[str, np.ndarray],
    geo: ImageGeometry | None,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Served outputs from the model's (NumPy twins); `feeds` are the model's inputs
    (pooling reads the attention mask)."""
    served = {name: outputs[name] for name in plan.passthrough if name in outputs}
    post = plan.post
    if isinstance(post, PoolPlan) and post.model_output in outputs:
        hidden = outputs[post.model_output]
        if post.modes:
            assert feeds is not None
            served[post.served] = pool(hidden, feeds[post.mask_input], post.modes, post.normalize)
        else:
            served[post.served] = np.ascontiguousarray(hidden, dtype=np.float32)
    elif isinstance(post, TopKPlan) and post.model_output in outputs:
        served["classes"], served["scores"] = classify.softmax_topk(
            outputs[post.model_output], post.k, post.softmax
        )
    elif isinstance(post, NmsPlan) and post.boxes in outputs and post.scores in outputs:
        names = ("boxes", "scores", "classes", "num_detections")
        result = nms_twin(outputs[post.boxes], outputs[post.scores], nms_settings(post, geo))
        served.update(zip(names, result, strict=True))
    if geo is not None and plan.pre is not None and plan.pre.kind == "letterbox":
        served[LETTERBOX_OUTPUT] = geo.info
    return served


def host_reports(plan: ProcessingPlan, reason: str) -> list[ProcessingReport]:
    """Reports for the steps the twins run."""
    reports = []
    if plan.pre is not None:
        reports.append(ProcessingReport(plan.pre.kind, "cpu", plan.pre.describe(), reason))
    if plan.post is not None:
        kind = {TopKPlan: "topk", NmsPlan: "nms", PoolPlan: "pool"}[type(plan.post)]
        reports.append(ProcessingReport(kind, "cpu", plan.post.describe(), reason))
    return reports


class HostProcessedBackend:
    """A backend on host arrays with the twins before and after it."""

    def __init__(self, inner: Backend, plan: ProcessingPlan, reason: str) -> None:
        self.inner = inner
        self.plan = plan
        self.inputs: list[TensorSpec] = plan.served_inputs
        self.outputs: list[TensorSpec] = plan.served_outputs
        self.placement: BackendPlacement = inner.placement
        self.processing = host_reports(plan, reason)

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        """Preprocess, run the model, postprocess; outputs in the order asked for."""
        feeds = dict(inputs)
        geo = None
        pre = self.plan.pre
        if pre is not None:
            images = feeds.pop(pre.served.name)
            feeds[pre.model_input.name] = preprocess_host(pre, images)
            geo = geometry(pre, images.shape[1], images.shape[2], images.shape[0])
        names = self.plan.model_outputs_for(output_names)
        results = dict(zip(names, self.inner.run(feeds, names), strict=True))
        try:
            served = postprocess_host(self.plan, results, geo, feeds)
        except ValueError as exc:  # the model produced a shape the postprocessing cannot take
            raise InternalError(f"postprocessing failed: {exc}") from exc
        return [served[name] for name in output_names]

    def terminate_runs(self) -> None:
        """Cut the model's runs in progress short."""
        self.inner.terminate_runs()

    def close(self) -> None:
        """Close the model."""
        self.inner.close()
