"""What processing does to a model's signature: the served inputs and outputs, checked
against the model's own when it loads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensord.backends.base import TensorSpec
from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.kernels.image import Layout, Normalisation
from tensord.kernels.nms import NmsSettings
from tensord.modelconfig.processing import NmsConfig, PreprocessConfig, TopKConfig

LETTERBOX_OUTPUT = "letterbox"
TOPK_OUTPUTS = ("classes", "scores")
NMS_OUTPUTS = ("boxes", "scores", "classes", "num_detections")
_FLOATS: dict[DType, np.dtype] = {
    DType.FLOAT32: np.dtype(np.float32),
    DType.FLOAT16: np.dtype(np.float16),
}


@dataclass(slots=True, frozen=True)
class ImagePlan:
    """Preprocessing: served uint8 images -> one model input."""

    kind: str
    served: TensorSpec
    model_input: TensorSpec
    height: int
    width: int
    layout: Layout
    dtype: np.dtype
    norm: Normalisation
    pad_value: float
    max_image_size: int

    def model_shape(self, n: int) -> tuple[int, int, int, int]:
        """The model input's shape for n images."""
        if self.layout == "nchw":
            return (n, 3, self.height, self.width)
        return (n, self.height, self.width, 3)

    def describe(self) -> str:
        """One line for Info."""
        order = "swap R/B" if self.norm.source_channels != (0, 1, 2) else "channels as given"
        pad = f", pad {self.pad_value:g}" if self.kind == "letterbox" else ""
        return (
            f"{self.kind} uint8 HWC -> {self.dtype.name} {self.layout.upper()} "
            f"{self.height}x{self.width} (bilinear, half-pixel centres{pad}), {order}, "
            f"mean {[round(v, 4) for v in self.norm.mean]}, "
            f"1/std {[round(v, 6) for v in self.norm.inv_std]}"
        )


@dataclass(slots=True, frozen=True)
class TopKPlan:
    """Postprocessing: softmax + top-k over one model output."""

    model_output: str
    k: int
    softmax: bool

    def describe(self) -> str:
        """One line for Info."""
        return f"{'softmax + ' if self.softmax else ''}top-{self.k} of {self.model_output!r}"


@dataclass(slots=True, frozen=True)
class NmsPlan:
    """Postprocessing: per-class NMS over two model outputs."""

    boxes: str
    scores: str
    settings: NmsSettings
    source_coordinates: bool

    def describe(self) -> str:
        """One line for Info."""
        s = self.settings
        return (
            f"per-class NMS of {self.boxes!r} ({s.box_format}) and {self.scores!r}: score > "
            f"{s.score_threshold:g}, IoU > {s.iou_threshold:g} suppresses, best "
            f"{s.max_candidates} candidates, up to {s.max_detections} detections"
        )


@dataclass(slots=True, frozen=True)
class PoolPlan:
    """Postprocessing: a text encoder's per-token vectors pooled into one vector per text
    (or the vector a pipeline's graph pooled itself, as float32)."""

    model_output: str
    modes: tuple[str, ...]
    """The pooling modes, concatenated; empty when the graph pooled."""
    normalize: bool
    mask_input: str
    served: str

    def describe(self) -> str:
        """One line for Info."""
        if not self.modes:
            return f"{self.model_output!r} as float32 {self.served!r}"
        norm = ", normalised" if self.normalize else ""
        return f"{'+'.join(self.modes)} pooling of {self.model_output!r}{norm}"


@dataclass(slots=True)
class ProcessingPlan:
    """Everything a processed model does differently from its bare backend."""

    pre: ImagePlan | None
    post: TopKPlan | NmsPlan | PoolPlan | None
    served_inputs: list[TensorSpec]
    served_outputs: list[TensorSpec]
    passthrough: frozenset[str]
    """Model outputs served as they are."""
    model_output_names: tuple[str, ...]
    """Every model output, in the model's order."""

    def model_outputs_for(self, served_names: Sequence[str]) -> list[str]:
        """The model outputs to compute for the asked-for served outputs."""
        names = [n for n in served_names if n in self.passthrough]
        post = self.post
        produced = {s.name for s in self.served_outputs} - self.passthrough - {LETTERBOX_OUTPUT}
        if post is not None and any(n in produced for n in served_names):
            needed = [post.boxes, post.scores] if isinstance(post, NmsPlan) else [post.model_output]
            names += [n for n in needed if n not in names]
        return names or [self.model_output_names[0]]  # a run computes at least one output


def _only(specs: Sequence[TensorSpec], given: str | None, what: str, key: str) -> TensorSpec:
    by_name = {s.name: s for s in specs}
    if given is not None:
        if given not in by_name:
            raise ModelLoadError(
                f"{key}: the model has no {what} {given!r}; it has {sorted(by_name)}"
            )
        return by_name[given]
    if len(specs) != 1:
        raise ModelLoadError(
            f"{key}: the model has {len(specs)} {what}s {sorted(by_name)}; name one"
        )
    return specs[0]


def plan_image(config: PreprocessConfig, inputs: Sequence[TensorSpec]) -> ImagePlan:
    """The preprocessing plan, or ModelLoadError naming the mismatch."""
    spec = _only(inputs, config.input, "input", "preprocess.input")
    where = f"preprocess: model input {spec.name!r} {spec.dtype.name.lower()} {list(spec.shape)}"
    dtype = _FLOATS.get(spec.dtype)
    if dtype is None or len(spec.shape) != 4:
        raise ModelLoadError(f"{where}: needs a float32 or float16 input of rank 4")
    channel_axis, hw = (1, (2, 3)) if config.layout == "nchw" else (3, (1, 2))
    if spec.shape[channel_axis] not in (3, -1):
        raise ModelLoadError(f"{where}: the {config.layout.upper()} channel dimension must be 3")
    if config.size is not None:
        height, width = config.size
        for axis, want in zip(hw, config.size, strict=True):
            if spec.shape[axis] not in (-1, want):
                raise ModelLoadError(f"{where}: preprocess.size {config.size} does not match")
    else:
        height, width = spec.shape[hw[0]], spec.shape[hw[1]]
        if height < 1 or width < 1:
            raise ModelLoadError(f"{where}: its height and width are dynamic; set preprocess.size")
    swap = config.channel_order != config.model_channel_order
    norm = Normalisation.from_mean_std(tuple(config.mean), tuple(config.std), swap)
    served = TensorSpec(config.name or spec.name, DType.UINT8, (spec.shape[0], -1, -1, 3))
    others = {s.name for s in inputs if s.name != spec.name}
    if served.name in others:
        raise ModelLoadError(
            f"preprocess.name {served.name!r} is another input of the model; the served "
            f"image input needs a name of its own (the model's inputs: "
            f"{sorted({*others, spec.name})})"
        )
    pad = 114.0 if config.pad_value is None else config.pad_value
    return ImagePlan(
        config.kind, served, spec, height, width, config.layout, dtype, norm, pad,
        config.max_image_size,
    )  # fmt: skip


def _plan_topk(
    config: TopKConfig, outputs: Sequence[TensorSpec]
) -> tuple[TopKPlan, list[TensorSpec]]:
    spec = _only(outputs, config.output, "output", "postprocess.output")
    where = f"postprocess: model output {spec.name!r} {spec.dtype.name.lower()} {list(spec.shape)}"
    if spec.dtype not in _FLOATS or len(spec.shape) != 2:
        raise ModelLoadError(f"{where}: top-k needs a float32 or float16 [N, classes] output")
    if spec.shape[1] != -1 and config.k > spec.shape[1]:
        raise ModelLoadError(f"{where}: k = {config.k} exceeds its {spec.shape[1]} classes")
    rows = spec.shape[0]
    served = [
        TensorSpec("classes", DType.INT32, (rows, config.k)),
        TensorSpec("scores", DType.FLOAT32, (rows, config.k)),
    ]
    return TopKPlan(spec.name, config.k, config.softmax), served


def _plan_nms(config: NmsConfig, outputs: Sequence[TensorSpec]) -> tuple[NmsPlan, list[TensorSpec]]:
    boxes = _only(outputs, config.boxes, "output", "postprocess.boxes")
    scores = _only(outputs, config.scores, "output", "postprocess.scores")
    for spec, last in ((boxes, 4), (scores, None)):
        if (
            spec.dtype is not DType.FLOAT32
            or len(spec.shape) != 3
            or (last is not None and spec.shape[2] not in (-1, last))
        ):
            raise ModelLoadError(
                f"postprocess: model output {spec.name!r} {spec.dtype.name.lower()} "
                f"{list(spec.shape)}: NMS needs float32 boxes [N, B, 4] and scores [N, B, classes]"
            )
    if -1 not in (boxes.shape[1], scores.shape[1]) and boxes.shape[1] != scores.shape[1]:
        raise ModelLoadError(
            f"postprocess: model outputs {boxes.name!r} {list(boxes.shape)} and {scores.name!r} "
            f"{list(scores.shape)} disagree on the number of boxes (dimension 1)"
        )
    settings = NmsSettings(
        config.score_threshold, config.iou_threshold, config.max_detections,
        config.max_candidates, config.box_format,
    )  # fmt: skip
    n, d = boxes.shape[0], config.max_detections
    served = [
        TensorSpec("boxes", DType.FLOAT32, (n, d, 4)),
        TensorSpec("scores", DType.FLOAT32, (n, d)),
        TensorSpec("classes", DType.INT32, (n, d)),
        TensorSpec("num_detections", DType.INT32, (n,)),
    ]
    return NmsPlan(boxes.name, scores.name, settings, config.source_coordinates), served


def plan_processing(
    pre_config: PreprocessConfig | None,
    post_config: TopKConfig | NmsConfig | None,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> ProcessingPlan | None:
    """The plan for a model's [preprocess]/[postprocess] tables; None when it has neither."""
    if pre_config is None and post_config is None:
        return None
    pre = plan_image(pre_config, inputs) if pre_config is not None else None
    served_inputs = [pre.served if pre and s.name == pre.model_input.name else s for s in inputs]
    post: TopKPlan | NmsPlan | None = None
    made: list[TensorSpec] = []
    if isinstance(post_config, TopKConfig):
        post, made = _plan_topk(post_config, outputs)
    elif isinstance(post_config, NmsConfig):
        post, made = _plan_nms(post_config, outputs)
    consumed = set()
    if isinstance(post, TopKPlan):
        consumed = {post.model_output}
    elif isinstance(post, NmsPlan):
        consumed = {post.boxes, post.scores}
    if pre is not None and pre.kind == "letterbox":
        made.append(TensorSpec(LETTERBOX_OUTPUT, DType.FLOAT32, (pre.served.shape[0], 4)))
    kept = [s for s in outputs if s.name not in consumed]
    clash = {s.name for s in kept} & {s.name for s in made}
    if clash:
        raise ModelLoadError(
            f"postprocess: the model's output(s) {sorted(clash)} clash with the processed "
            f"outputs {[s.name for s in made]}"
        )
    return ProcessingPlan(
        pre, post, served_inputs, [*made, *kept], frozenset(s.name for s in kept),
        tuple(s.name for s in outputs),
    )  # fmt: skip


def plan_pooling(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], plan: PoolPlan
) -> ProcessingPlan:
    """The plan that serves a text encoder's pooled vectors (its only output) from the
    model's token inputs."""
    by_name = {s.name: s for s in outputs}
    spec = by_name.get(plan.model_output)
    if spec is None:
        raise ModelLoadError(f"the model has no output {plan.model_output!r}")
    rank = 2 if not plan.modes else 3
    if spec.dtype not in _FLOATS or len(spec.shape) != rank:
        raise ModelLoadError(
            f"model output {spec.name!r} {spec.dtype.name.lower()} {list(spec.shape)}: pooling "
            f"needs float32 or float16 of rank {rank}"
        )
    dims = spec.shape[-1] * max(1, len(plan.modes)) if spec.shape[-1] > 0 else -1
    served = [TensorSpec(plan.served, DType.FLOAT32, (spec.shape[0], dims))]
    return ProcessingPlan(
        None, plan, list(inputs), served, frozenset(), tuple(s.name for s in outputs)
    )
