"""Softmax + top-k and NMS twins against hand-computed cases and independent references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensord.kernels.classify import softmax_topk
from tensord.kernels.nms import NmsSettings, nms


def test_topk_breaks_ties_by_index_and_softmaxes() -> None:
    idx, probs = softmax_topk(np.array([[1, 3, 3, 2]], np.float32), 3)
    assert idx.dtype == np.int32 and probs.dtype == np.float32
    assert idx.tolist() == [[1, 2, 3]]
    total = math.exp(-2) + 1 + 1 + math.exp(-1)
    np.testing.assert_allclose(probs[0], [1 / total, 1 / total, math.exp(-1) / total], rtol=1e-6)


def test_topk_without_softmax_returns_the_values() -> None:
    idx, values = softmax_topk(np.array([[0.5, -1, 0.75], [2, 2, 2]], np.float16), 2, False)
    assert idx.tolist() == [[2, 0], [0, 1]]
    assert values.tolist() == [[0.75, 0.5], [2, 2]]


def test_topk_ranks_nan_last() -> None:
    idx, _ = softmax_topk(np.array([[np.nan, 1, np.nan, 0]], np.float32), 4, False)
    assert idx.tolist() == [[1, 3, 0, 2]]


def test_topk_matches_a_float64_reference() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 4, (17, 1000)).astype(np.float32)
    logits[3, 10:20] = logits[3, 500]  # ties
    idx, probs = softmax_topk(logits, 7)
    x = logits.astype(np.float64)
    soft = np.exp(x - x.max(axis=1, keepdims=True))
    soft /= soft.sum(axis=1, keepdims=True)
    for r in range(len(x)):
        ref = sorted(range(x.shape[1]), key=lambda j, r=r: (-x[r, j], j))[:7]
        assert idx[r].tolist() == ref
        np.testing.assert_allclose(probs[r], soft[r, ref], rtol=1e-5)


def test_topk_refuses_bad_k() -> None:
    with pytest.raises(ValueError, match="k must be between 1 and the number of classes"):
        softmax_topk(np.zeros((1, 4), np.float32), 5)


BOXES = np.array([[[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10]]], np.float32)
SCORES = np.array([[[0.9, 0.1], [0.8, 0.7], [0.3, 0.2], [0.9, 0.05]]], np.float32)


def test_nms_by_hand() -> None:
    s = NmsSettings(score_threshold=0.15, iou_threshold=0.5, max_detections=5)
    boxes, scores, classes, count = nms(BOXES, SCORES, s)
    assert count.tolist() == [4]
    # b0/c0 (0.9) beats its twin b3 (0.9, higher index) and b1 (IoU 81/119 = 0.68);
    # b1/c1 survives: suppression is per class.
    assert classes.tolist() == [[0, 1, 0, 1, -1]]
    np.testing.assert_array_equal(scores, np.array([[0.9, 0.7, 0.3, 0.2, 0]], np.float32))
    np.testing.assert_array_equal(
        boxes[0], [[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [20, 20, 30, 30], [0, 0, 0, 0]]
    )


def test_nms_limits_thresholds_and_formats() -> None:
    _, _, classes, count = nms(BOXES, SCORES, NmsSettings(0.15, 0.5, max_detections=2))
    assert count.tolist() == [2] and classes.tolist() == [[0, 1]]
    _, _, classes, count = nms(BOXES, SCORES, NmsSettings(0.15, 0.5, 5, max_candidates=2))
    assert count.tolist() == [1]  # only b0/c0 and its duplicate were candidates
    _, _, _, count = nms(BOXES, SCORES, NmsSettings(0.15, 0.7, 5))
    assert count.tolist() == [5]  # IoU 0.68 no longer suppresses b1/c0
    centre = BOXES.copy()
    centre[..., :2] = (BOXES[..., :2] + BOXES[..., 2:]) / 2
    centre[..., 2:] = BOXES[..., 2:] - BOXES[..., :2]
    got = nms(centre, SCORES, NmsSettings(0.15, 0.5, 5, box_format="cxcywh"))
    want = nms(BOXES, SCORES, NmsSettings(0.15, 0.5, 5))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    mapped = nms(BOXES, SCORES, NmsSettings(0.15, 0.5, 5, box_offset=(0, 5), box_scale=(2, 2)))
    np.testing.assert_array_equal(mapped[0][0, 0], [0, -2.5, 5, 2.5])


def test_nms_flipped_corners_and_empty() -> None:
    flipped = BOXES[:, :, [2, 3, 0, 1]]
    a = nms(flipped, SCORES, NmsSettings(0.15, 0.5, 5))
    b = nms(BOXES, SCORES, NmsSettings(0.15, 0.5, 5))
    np.testing.assert_array_equal(a[0], b[0])
    _, _, classes, count = nms(BOXES, SCORES, NmsSettings(0.95, 0.5, 3))
    assert count.tolist() == [0] and classes.tolist() == [[-1, -1, -1]]


def reference_nms(boxes: np.ndarray, scores: np.ndarray, thr: float, iou_thr: float, d: int):  # type: ignore[no-untyped-def]
    """Plain Python in float64: greedy per-class NMS, ties by (box, class) index."""
    cands = [
        (-float(scores[b, c]), b * scores.shape[1] + c, b, c)
        for b in range(scores.shape[0])
        for c in range(scores.shape[1])
        if scores[b, c] > np.float32(thr)
    ]
    cands.sort()
    kept: list[tuple[int, int]] = []
    for _, _, b, c in cands:
        x1, y1, x2, y2 = (float(v) for v in boxes[b])
        ok = True
        for kb, kc in kept:
            if kc != c:
                continue
            a1, b1, a2, b2 = (float(v) for v in boxes[kb])
            iw, ih = min(x2, a2) - max(x1, a1), min(y2, b2) - max(y1, b1)
            inter = iw * ih if iw > 0 and ih > 0 else 0.0
            union = (x2 - x1) * (y2 - y1) + (a2 - a1) * (b2 - b1) - inter
            if union > 0 and inter / union > iou_thr:
                ok = False
                break
        if ok:
            kept.append((b, c))
            if len(kept) == d:
                break
    return kept


def test_nms_matches_a_plain_reference_on_random_detections() -> None:
    rng = np.random.default_rng(5)
    n, b, c = 4, 300, 5
    xy = rng.uniform(0, 200, (n, b, 2)).astype(np.float32)
    wh = rng.uniform(5, 60, (n, b, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + wh], axis=2)
    scores = (rng.integers(0, 20, (n, b, c)) / 20).astype(np.float32)  # many ties
    s = NmsSettings(0.3, 0.45, 60, 2048)
    out_boxes, out_scores, out_classes, count = nms(boxes, scores, s)
    for i in range(n):
        kept = reference_nms(boxes[i], scores[i], 0.3, 0.45, 60)
        assert count[i] == len(kept)
        assert out_classes[i, : len(kept)].tolist() == [k[1] for k in kept]
        np.testing.assert_array_equal(out_boxes[i, : len(kept)], boxes[i, [k[0] for k in kept]])
        np.testing.assert_array_equal(
            out_scores[i, : len(kept)], [scores[i, k[0], k[1]] for k in kept]
        )


def test_nms_refuses_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"boxes must be float32 \[N, B, 4\]"):
        nms(BOXES[..., :3], SCORES, NmsSettings())
    with pytest.raises(ValueError, match="scores must be float32"):
        nms(BOXES, SCORES[:, :2], NmsSettings())
    with pytest.raises(ValueError, match=r"max_candidates must be 1\.\.2048"):
        NmsSettings(max_candidates=4096)
