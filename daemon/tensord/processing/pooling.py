"""Pooling token vectors into one vector per text, as sentence-transformers' Pooling and
Normalize modules compute them, on host arrays (NumPy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_EPS_COUNT = 1e-9
"""sentence-transformers clamps a text's token count (its mask's sum) to at least this."""
_EPS_NORM = 1e-12
"""torch.nn.functional.normalize's floor on a vector's length."""


def pool(hidden: np.ndarray, mask: np.ndarray, modes: Sequence[str], normalize: bool) -> np.ndarray:
    """float32 [B, H x len(modes)] from token vectors [B, T, H] and the attention mask
    [B, T] (1 for a text's tokens, 0 for padding), the modes' vectors concatenated in
    order; scaled to unit length when `normalize`."""
    h = np.asarray(hidden, dtype=np.float32)
    m = np.asarray(mask).astype(np.float32, copy=False)
    parts = []
    for mode in modes:
        if mode == "cls":
            parts.append(h[:, 0])
        elif mode == "max":
            parts.append(np.where(m[:, :, None] > 0, h, np.float32(-1e9)).max(axis=1))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            total = np.einsum("btd,bt->bd", h, m)
            count = np.maximum(m.sum(axis=1, keepdims=True), _EPS_COUNT)
            parts.append(total / (count if mode == "mean" else np.sqrt(count)))
        elif mode == "weightedmean":
            w = m * np.arange(1, m.shape[1] + 1, dtype=np.float32)
            total = np.einsum("btd,bt->bd", h, w)
            parts.append(total / np.maximum(w.sum(axis=1, keepdims=True), _EPS_COUNT))
        elif mode == "lasttoken":
            t = m.shape[1]
            last = t - 1 - np.argmax(m[:, ::-1] > 0, axis=1)
            rows = np.arange(h.shape[0])
            parts.append(h[rows, last] * m[rows, last][:, None])
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    out = np.ascontiguousarray(out, dtype=np.float32)
    return normalized(out) if normalize else out


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, _EPS_NORM)).astype(np.float32, copy=False)
