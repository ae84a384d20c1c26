"""NumPy twin of softmax_topk.cu: softmax over the last axis, then the k best classes.

Selection is on the logits in one total order: larger first, equal values by smaller
index, NaN after every number. It is exact on both paths; probabilities agree within
float32 rounding of exp() and of the sum's order.
"""

from __future__ import annotations

import numpy as np


def softmax_topk(
    logits: np.ndarray, k: int, apply_softmax: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """[rows, cols] float32/float16 -> (int32 [rows, k] class indices, float32 [rows, k]
    probabilities, or the logits themselves without softmax)."""
    if logits.ndim != 2 or logits.dtype not in (np.float32, np.float16):
        raise ValueError(
            f"logits must be float32 or float16 [rows, classes], got {logits.dtype} "
            f"{list(logits.shape)}"
        )
    rows, cols = logits.shape
    if not 1 <= k <= cols:
        raise ValueError(f"k must be between 1 and the number of classes ({cols}), got {k}")
    x = logits.astype(np.float32)
    nan = np.isnan(x)
    index = np.broadcast_to(np.arange(cols), x.shape)
    # lexsort: the last key is primary. -x with NaN zeroed (the NaN key already ranks them).
    order = np.lexsort((index, -np.where(nan, np.float32(0), x), nan), axis=1)[:, :k]
    chosen = np.take_along_axis(x, order, axis=1)
    if not apply_softmax:
        return order.astype(np.int32), chosen
    masked = np.where(nan, np.float32(-np.inf), x)
    m = masked.max(axis=1, keepdims=True) if cols else np.zeros((rows, 1), np.float32)
    with np.errstate(invalid="ignore"):
        total = np.exp(x - m).sum(axis=1, keepdims=True, dtype=np.float32)
        probs = np.exp(chosen - m) / total
    return order.astype(np.int32), probs.astype(np.float32)
