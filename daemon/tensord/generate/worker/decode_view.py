"""The batched past a decode pass feeds, kept from step to step.

A view holds, per layer, the keys and values [B, kv_heads, width, head_dim] of its rows,
each sequence right-aligned (padding first, zero, masked), and the attention mask. After a
pass the model's `present` outputs are the next view as they are (ONNX Runtime has
appended the new token), so a steady batch costs no copy at all.

Rows are slots. When sequences leave and others join, `patch` writes each newcomer's past
(gathered from the pool) into a row a leaver freed, in place; a row left free decodes a
masked pad token that nothing reads until a newcomer takes it. Only when that cannot work
(more newcomers than free rows, a newcomer longer than the width, too many free rows, or
a width far beyond the longest sequence) does `assemble` build a new view: rows of
sequences that decoded last step copied from their old view (one take per tensor), the
others gathered from the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tensord.generate.worker.kv_storage import KVStorage

TRIM_SLACK = 16
"""Rebuild when the width exceeds the longest sequence by more than this: every pass's
attention and ONNX Runtime's past + new copy grow with the width."""


class Decoding(Protocol):
    """What a view reads of a scheduled request (core's ScheduledRequest)."""

    @property
    def request_id(self) -> str: ...
    @property
    def start_pos(self) -> int: ...
    @property
    def block_ids(self) -> Sequence[int]: ...


@dataclass(slots=True)
class DecodeView:
    """The persistent past of one decode pass."""

    request_ids: list[str | None]
    """Each row's sequence; None for a free row."""
    lengths: list[int]
    """Real tokens per row (the next position); 0 for a free row."""
    mask: np.ndarray
    """[B, width] int64: 1 where a row holds a real token (its last lengths[r] columns)."""
    past: list[np.ndarray]
    """Keys and values of every layer, [key 0, value 0, key 1, ...], each [B, H, width, D]."""

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    def active(self) -> list[int]:
        """The rows that hold a sequence."""
        return [r for r, rid in enumerate(self.request_ids) if rid is not None]


def right_aligned_mask(lengths: Sequence[int], width: int) -> np.ndarray:
    """[B, width] int64: 1 in each row's last lengths[b] columns."""
    return (np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]).astype(np.int64)


def patch(
    view: DecodeView, items: Mapping[str, Decoding], storage: KVStorage, free_rows: bool
) -> DecodeView | None:
    """`view` changed in place to hold `items` (by request id), or None when a new view
    must be assembled. Without `free_rows` only the same sequences, one step on, fit."""
    rows = {rid: r for r, rid in enumerate(view.request_ids) if rid is not None}
    keep = {
        rid
        for rid, item in items.items()
        if rid in rows and view.lengths[rows[rid]] == item.start_pos
    }
    fresh = [item for rid, item in items.items() if rid not in keep]
    free = [r for r, rid in enumerate(view.request_ids) if rid not in keep]
    if not free_rows and (fresh or free):
        return None
    longest = max(item.start_pos for item in items.values())
    if (
        len(fresh) > len(free)
        or longest > view.width
        or view.width - longest > TRIM_SLACK
        or len(free) - len(fresh) > max(1, len(view.request_ids) // 4)
    ):
        return None
    for r, item in zip(free, fresh, strict=False):
        storage.gather([item.block_ids], [item.start_pos], [t[r : r + 1] for t in view.past])
        view.request_ids[r], view.lengths[r] = item.request_id, item.start_pos
        view.mask[r] = right_aligned_mask([item.start_pos], view.width)[0]
    for r in free[len(fresh) :]:
        view.request_ids[r], view.lengths[r] = None, 0
        view.mask[r] = 0
    return view


def assemble(
    items: Sequence[Decoding], previous: Iterable[DecodeView], storage: KVStorage
) -> DecodeView:
    """A new view for `items`: rows of sequences that decoded last step (any previous view)
    copied from there, kept rows first in their old order, then the others from the pool."""
    found: dict[str, tuple[DecodeView, int]] = {}
    for old in previous:
        for row, rid in enumerate(old.request_ids):
            if rid is not None:
                found[rid] = (old, row)
    kept: dict[int, tuple[DecodeView, list[Decoding], list[int]]] = {}
    fresh: list[Decoding] = []
    for item in items:
        source = found.get(item.request_id)
        if source is not None and source[0].lengths[source[1]] == item.start_pos:
            group = kept.setdefault(id(source[0]), (source[0], [], []))
            group[1].append(item)
            group[2].append(source[1])
        else:
            fresh.append(item)
    for _, members, rows in kept.values():  # each old view's rows in their old order
        pairs = sorted(zip(rows, members, strict=True), key=lambda pair: pair[0])
        rows[:], members[:] = [r for r, _ in pairs], [m for _, m in pairs]
    ordered = [i for _, members, _ in kept.values() for i in members] + fresh
    lengths = [i.start_pos for i in ordered]
    width = max(lengths)
    out = storage.reserve(len(ordered), width)
    start = 0
    for old, _, rows in kept.values():
        index = np.array(rows, np.intp)
        for src, dst in zip(old.past, out, strict=True):
            _copy_rows(src, index, dst[start : start + len(rows)])
        start += len(rows)
    if fresh:
        tables = [i.block_ids for i in fresh]
        storage.gather(tables, [i.start_pos for i in fresh], [t[start:] for t in out])
    mask = right_aligned_mask(lengths, width)
    return DecodeView([i.request_id for i in ordered], lengths, mask, out)


def _copy_rows(src: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[r] = src[rows[r]], right-aligned: the last columns of each kept; zeros before
    when `out` is wider (a longer newcomer joined). Columns left of a sequence's tokens
    are zero in every view (padding is fed as zeros and ONNX Runtime copies it)."""
    width, have = out.shape[2], src.shape[2]
    if width <= have:
        np.take(src[:, :, have - width :], rows, axis=0, out=out)
    else:
        out[:, :, : width - have] = 0
        out[:, :, width - have :] = src[rows]
