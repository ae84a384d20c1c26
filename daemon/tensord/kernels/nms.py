"""NumPy twin of nms.cu: per-class non-maximum suppression, ties broken by index.

The candidate order, the IoU arithmetic (one IEEE float32 operation per step, in the
kernel's order) and the greedy rule are those of the kernel, so the kept boxes are the
same on both paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

BoxFormat = Literal["xyxy", "cxcywh"]
MAX_CANDIDATES = 2048
"""NMS_CAP in nms.cu: the most candidates one image can keep before suppression."""


@dataclass(slots=True, frozen=True)
class NmsSettings:
    """Thresholds and limits; see kernels/nms.cu."""

    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100
    max_candidates: int = 1024
    box_format: BoxFormat = "xyxy"
    box_offset: tuple[float, float] = (0.0, 0.0)
    """(x, y) subtracted from output boxes (letterbox offsets), then divided by box_scale."""
    box_scale: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        if not 1 <= self.max_candidates <= MAX_CANDIDATES:
            raise ValueError(f"max_candidates must be 1..{MAX_CANDIDATES}")
        if not 1 <= self.max_detections <= MAX_CANDIDATES:
            raise ValueError(f"max_detections must be 1..{MAX_CANDIDATES}")


def canonical_boxes(boxes: np.ndarray, box_format: BoxFormat) -> tuple[np.ndarray, ...]:
    """(x1, y1, x2, y2) float32 with x1 <= x2 and y1 <= y2 (nms.cu: canonical_box)."""
    a0, a1, a2, a3 = (boxes[..., i] for i in range(4))
    if box_format == "cxcywh":
        hw, hh = a2 * np.float32(0.5), a3 * np.float32(0.5)
        a0, a1, a2, a3 = a0 - hw, a1 - hh, a0 + hw, a1 + hh
    return np.minimum(a0, a2), np.minimum(a1, a3), np.maximum(a0, a2), np.maximum(a1, a3)


def _one_image(
    boxes: np.ndarray, scores: np.ndarray, s: NmsSettings
) -> tuple[list[int], np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    classes = scores.shape[1]
    flat = scores.reshape(-1)
    cand = np.flatnonzero(flat > np.float32(s.score_threshold))
    order = np.lexsort((cand, -flat[cand]))
    cand = cand[order][: s.max_candidates]
    box_of, cls = cand // classes, (cand % classes).astype(np.int32)
    x1, y1, x2, y2 = canonical_boxes(boxes[box_of], s.box_format)
    area = (x2 - x1) * (y2 - y1)
    thr = np.float32(s.iou_threshold)
    removed = np.zeros(len(cand), dtype=bool)
    kept: list[int] = []
    for i in range(len(cand)):
        if removed[i]:
            continue
        kept.append(i)
        if len(kept) == s.max_detections:
            break
        j = np.flatnonzero((cls[i + 1 :] == cls[i]) & ~removed[i + 1 :]) + i + 1
        iw = np.minimum(x2[i], x2[j]) - np.maximum(x1[i], x1[j])
        ih = np.minimum(y2[i], y2[j]) - np.maximum(y1[i], y1[j])
        inter = np.where((iw > 0) & (ih > 0), iw * ih, np.float32(0))
        union = (area[i] + area[j]) - inter
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        removed[j[iou > thr]] = True
    return kept, flat[cand], cls, (x1, y1, x2, y2)


def nms(
    boxes: np.ndarray, scores: np.ndarray, settings: NmsSettings
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """boxes float32 [N, B, 4], scores float32 [N, B, C] -> (boxes [N, D, 4] xyxy,
    scores [N, D], classes int32 [N, D], counts int32 [N]) with D = max_detections;
    slots past an image's count hold zeros and class -1."""
    if boxes.dtype != np.float32 or boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"boxes must be float32 [N, B, 4], got {boxes.dtype} {list(boxes.shape)}")
    if scores.dtype != np.float32 or scores.ndim != 3 or scores.shape[:2] != boxes.shape[:2]:
        raise ValueError(
            f"scores must be float32 [N, B, C] matching boxes {list(boxes.shape)}, got "
            f"{scores.dtype} {list(scores.shape)}"
        )
    n, d = boxes.shape[0], settings.max_detections
    out_boxes = np.zeros((n, d, 4), dtype=np.float32)
    out_scores = np.zeros((n, d), dtype=np.float32)
    out_classes = np.full((n, d), -1, dtype=np.int32)
    counts = np.zeros(n, dtype=np.int32)
    ox, oy = (np.float32(v) for v in settings.box_offset)
    sx, sy = (np.float32(v) for v in settings.box_scale)
    for img in range(n):
        kept, cand_scores, cls, (x1, y1, x2, y2) = _one_image(boxes[img], scores[img], settings)
        k = np.array(kept, dtype=np.int64)
        counts[img] = len(kept)
        out_boxes[img, : len(k)] = np.stack(
            [(x1[k] - ox) / sx, (y1[k] - oy) / sy, (x2[k] - ox) / sx, (y2[k] - oy) / sy], axis=1
        )
        out_scores[img, : len(k)] = cand_scores[k]
        out_classes[img, : len(k)] = cls[k]
    return out_boxes, out_scores, out_classes, counts
