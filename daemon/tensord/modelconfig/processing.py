"""The `[preprocess]` and `[postprocess]` tables of model.toml."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from tensord.config_tables import Settings, TaggedSettings

_MIN_STD = 1e-30
"""Smallest std accepted: 1/std stays a finite float32 with room to spare."""


class PreprocessConfig(Settings):
    """`[preprocess]`: Predict takes uint8 images [N, H, W, 3] (HWC) for one model input,
    resized (bilinear, OpenCV's half-pixel convention) and normalised on the way in. The
    images of one request share H and W; requests may differ."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["resize", "letterbox"] = "resize"
    """`resize` stretches to the model's size; `letterbox` keeps the aspect ratio and pads."""
    input: str | None = None
    """The model input it feeds (float32 or float16, [N, 3, H, W] or [N, H, W, 3]); default:
    the model's only input."""
    name: str | None = None
    """The served uint8 input's name; default: the model input's name."""
    channel_order: Literal["rgb", "bgr"] = "rgb"
    """Channel order of the request's images."""
    model_channel_order: Literal["rgb", "bgr"] = "rgb"
    """Channel order the model expects; channels are swapped when the two differ."""
    mean: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Per model channel, in pixel units (0-255): out = (pixel - mean) / std."""
    std: list[float] = Field(default_factory=lambda: [1.0, 1.0, 1.0])
    """Per model channel, in pixel units, each > 0 (255 for each maps pixels to 0-1)."""
    layout: Literal["nchw", "nhwc"] = "nchw"
    """The model input's layout."""
    size: list[int] | None = None
    """[height, width] of the model input; default: the model's fixed dimensions."""
    pad_value: float | None = Field(default=None, ge=0.0, le=255.0)
    """letterbox only: the pixel value of the padding (before normalisation); default 114."""
    max_image_size: int = Field(default=8192, ge=1, le=65535)
    """Largest image height or width accepted; larger gets INVALID_ARGUMENT."""

    @field_validator("mean", "std")
    @classmethod
    def _three(cls, value: list[float]) -> list[float]:
        if len(value) != 3:
            raise ValueError(f"needs 3 values (one per channel), got {value}")
        if not all(math.isfinite(v) for v in value):
            raise ValueError(f"needs finite numbers, got {value}")
        return value

    @field_validator("std")
    @classmethod
    def _positive(cls, value: list[float]) -> list[float]:
        # The kernels multiply by 1/std in float32: it must be finite and positive there.
        if any(not v >= _MIN_STD for v in value):
            raise ValueError(f"std values must be at least {_MIN_STD:g}, got {value}")
        return value

    @field_validator("size")
    @classmethod
    def _size(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (len(value) != 2 or any(not 1 <= v <= 65535 for v in value)):
            raise ValueError(f"size is [height, width], each 1..65535, got {value}")
        return value

    @model_validator(mode="after")
    def _pad(self) -> PreprocessConfig:
        if self.kind == "resize" and self.pad_value is not None:
            raise ValueError('pad_value applies only to kind = "letterbox"')
        return self


class TopKConfig(TaggedSettings):
    """`[postprocess]` with kind = "topk": softmax + top-k over a classifier's output
    [N, classes]; serves `classes` int32 [N, k] and `scores` float32 [N, k]."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["topk"]
    """Selects this table's shape."""
    output: str | None = None
    """The model output (float32 or float16 [N, classes]); default: the model's only output."""
    k: int = Field(default=5, ge=1, le=4096)
    """Classes returned per row, best first (ties: lower class index first)."""
    softmax: bool = True
    """Return softmax probabilities; false returns the output's own values (for models that
    already end in a softmax)."""


class NmsConfig(TaggedSettings):
    """`[postprocess]` with kind = "nms": per-class non-maximum suppression over a
    detector's boxes [N, B, 4] and scores [N, B, classes]; serves `boxes` float32
    [N, D, 4] (x1, y1, x2, y2), `scores` float32 [N, D], `classes` int32 [N, D] and
    `num_detections` int32 [N], D = max_detections (unused slots: 0 and class -1)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["nms"]
    """Selects this table's shape."""
    boxes: str = "boxes"
    """The model output holding boxes, float32 [N, B, 4]."""
    scores: str = "scores"
    """The model output holding class scores, float32 [N, B, classes]."""
    box_format: Literal["xyxy", "cxcywh"] = "xyxy"
    """Corners (x1, y1, x2, y2), or centre and size (cx, cy, w, h)."""
    score_threshold: float = Field(default=0.25, allow_inf_nan=False, ge=-1e30, le=1e30)
    """Pairs (box, class) with score > this are candidates."""
    iou_threshold: float = Field(default=0.45, ge=0.0, le=1.0)
    """A candidate is suppressed by a kept one of its class with IoU > this."""
    max_detections: int = Field(default=100, ge=1, le=2048)
    """Detections returned per image, best first (ties: lower box, then class index)."""
    max_candidates: int = Field(default=1024, ge=1, le=2048)
    """Best candidates per image considered by the suppression."""
    source_coordinates: bool = True
    """With [preprocess], return boxes in the request image's pixels instead of the model
    input's."""


PostprocessConfig = Annotated[TopKConfig | NmsConfig, Field(discriminator="kind")]
