"""One engine step on the model: gather the past from the KV pool, run, scatter, logits.

A step's items are cut into model passes by the model's batch layout (batch_layout.py):
all of them in one pass (padded), one pass per past length (equal_length), or one pass
each (single). Pasts are right-aligned: a shorter sequence's padding comes first, carries
attention_mask 0, and the step's new tokens follow each sequence's own last position, so
key offsets within a sequence are what they are alone; position_ids are each sequence's
real positions.

Prefill chunks (several tokens per sequence, ragged, right-padded) run over a past
gathered from the pool. Decode passes keep a persistent view each: while the same
sequences decode in the same order, the model's `present` outputs are the next step's past
as they are (ONNX Runtime has already appended the new token, still right-aligned), and
only the new token's keys and values are written to the pool. Any change of membership
rebuilds that view from the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tensord.generate.batch_layout import BatchLayout
from tensord.generate.kv_storage import KVStorage


@dataclass(slots=True)
class StepItem:
    """One sequence's part of a step."""

    request_id: str
    token_ids: Sequence[int]
    """Tokens fed this step (a prompt chunk, or the last sampled token)."""
    start: int
    """Tokens of this sequence already in the KV cache (the first fed token's position)."""
    block_table: Sequence[int]
    """Its blocks, covering start + len(token_ids) positions."""
    wants_logits: bool = True
    """False for a prefill chunk that does not reach the end of the prompt."""


def _is_decode(item: StepItem) -> bool:
    """One token after cached ones, whose logits are wanted: a decode step (or the last
    token of a prompt whose other tokens were cached). A one-token prompt chunk that does
    not end its prompt is a prefill: the decode path gives every row's logits."""
    return len(item.token_ids) == 1 and item.start > 0 and item.wants_logits


class StepLogits(Mapping[str, np.ndarray]):
    """A step's next-token logits: row i of `rows` [N, V] belongs to `request_ids[i]`.

    The rows stay one array (the sampler takes them as they are); looking a request up by
    id gives its row."""

    __slots__ = ("_index", "request_ids", "rows")

    def __init__(self, request_ids: list[str], rows: np.ndarray) -> None:
        self.request_ids = request_ids
        self.rows = rows
        self._index: dict[str, int] | None = None

    def __getitem__(self, request_id: str) -> np.ndarray:
        if self._index is None:
            self._index = {rid: i for i, rid in enumerate(self.request_ids)}
        return self.rows[self._index[request_id]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.request_ids)

    def __len__(self) -> int:
        return len(self.request_ids)


@dataclass(slots=True)
class _DecodeView:
    """The persistent past of the decoding batch."""

    request_ids: list[str]
    lengths: list[int]
    """Real tokens per sequence (the next position); the longest fills the width."""
    mask: np.ndarray
    """[B, width] int64: 1 where the view holds a real token (the last lengths[b] columns)."""
    past: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])


@dataclass(slots=True)
class PassStats:
    """Model passes run so far and the sequences they carried (shown by Info)."""

    passes: int = 0
    sequences: int = 0
    """Sequences summed over passes: sequences / passes is the mean batch."""
    max_sequences: int = 0
    """The most sequences one pass carried."""

    def count(self, batch: int) -> None:
        self.passes += 1
        self.sequences += batch
        self.max_sequences = max(self.max_sequences, batch)


class ModelRunner:
    """Runs steps of one Optimum-layout decoder over a KVStorage; `run(feeds, names)` is
    the backend's blocking run."""

    def __init__(
        self,
        run: Callable[[Mapping[str, np.ndarray], Sequence[str]], list[np.ndarray]],
        storage: KVStorage,
        num_layers: int,
        has_position_ids: bool,
        pad_token_id: int = 0,
        layout: BatchLayout = BatchLayout.PADDED,
    ) -> None:
        self._run_model = run
        self.storage = storage
        self._layers = num_layers
        self._has_positions = has_position_ids
        self._pad = pad_token_id
        self.layout = layout
        self.stats = PassStats()
        self._present_names = [
            name for i in range(num_layers) for name in (f"present.{i}.key", f"present.{i}.value")
        ]
        self._views: dict[frozenset[str], _DecodeView] = {}
        self._before_run: Callable[[], None] | None = None

    def execute(
        self, items: Sequence[StepItem], before_run: Callable[[], None] | None = None
    ) -> StepLogits:
        """Run the step's items; the last-position logits [V] of each item that wants them.

        `before_run` is called once, just before the first model pass starts (the engine
        hands the previous step's tokens to the event loop there, so that the loop's work
        overlaps the pass, which runs without the GIL)."""
        self._before_run = before_run
        decodes: list[StepItem] = []
        prefills: list[StepItem] = []
        for item in items:
            (decodes if _is_decode(item) else prefills).append(item)
        parts = [self._prefill(group) for group in self._passes(prefills)]
        views: dict[frozenset[str], _DecodeView] = {}
        parts.extend(self._decode(group, views) for group in self._passes(decodes))
        self._views = views
        if len(parts) == 1:
            return parts[0]
        ids = [i for part in parts for i in part.request_ids]
        rows = [part.rows for part in parts if len(part.request_ids)]
        return StepLogits(ids, np.concatenate(rows) if rows else np.zeros((0, 0), np.float32))

    def reset(self) -> None:
        """Forget the decode views (after preemption, aborts or errors)."""
        self._views = {}

    def _passes(self, items: list[StepItem]) -> list[list[StepItem]]:
        """The items cut into model passes as the layout allows."""
        if not items:
            return []
        if self.layout is BatchLayout.PADDED:
            return [items]
        if self.layout is BatchLayout.SINGLE:
            return [[item] for item in items]
        by_start: dict[int, list[StepItem]] = {}
        for item in items:
            by_start.setdefault(item.start, []).append(item)
        return list(by_start.values())

    def _run(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        past: Sequence[tuple[np.ndarray, np.ndarray]],
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        feeds: dict[str, np.ndarray] = {"input_ids": ids, "attention_mask": mask}
        if self._has_positions:
            feeds["position_ids"] = positions
        for i, (k, v) in enumerate(past):
            feeds[f"past_key_values.{i}.key"] = k
            feeds[f"past_key_values.{i}.value"] = v
        if self._before_run is not None:
            before, self._before_run = self._before_run, None
            before()
        self.stats.count(len(ids))
        out = self._run_model(feeds, ["logits", *self._present_names])
        present = [(out[1 + 2 * i], out[2 + 2 * i]) for i in range(self._layers)]
        return out[0], present

    def _prefill(self, items: Sequence[StepItem]) -> StepLogits:
        b = len(items)
        width = max(i.start for i in items)
        t_max = max(len(i.token_ids) for i in items)
        ids = np.full((b, t_max), self._pad, np.int64)
        mask = np.zeros((b, width + t_max), np.int64)
        positions = np.zeros((b, t_max), np.int64)
        for row, item in enumerate(items):
            n = len(item.token_ids)
            ids[row, :n] = item.token_ids
            mask[row, width - item.start : width + n] = 1
            positions[row] = item.start + np.minimum(np.arange(t_max), n - 1)
        tables = [i.block_table for i in items]
        past = self.storage.gather(tables, [i.start for i in items], width)
        logits, present = self._run(ids, mask, positions, past)
        counts = [len(i.token_ids) for i in items]
        self.storage.scatter(tables, [i.start for i in items], counts, present, width)
        wanted = [row for row, item in enumerate(items) if item.wants_logits]
        last = np.array([counts[row] - 1 for row in wanted], np.int64)
        return StepLogits([items[row].request_id for row in wanted], logits[wanted, last])

    def _decode(
        self, items: Sequence[StepItem], views: dict[frozenset[str], _DecodeView]
    ) -> StepLogits:
        """One decode pass; its next view goes into `views` under the pass's request ids.
        The pass's rows follow the view's order (the logits say whose row is whose)."""
        by_id = {i.request_id: i for i in items}
        key = frozenset(by_id)
        view = self._views.get(key)
        if view is None or any(
            by_id[r].start != n for r, n in zip(view.request_ids, view.lengths, strict=True)
        ):
            view = self._assemble(items)
        ordered = [by_id[r] for r in view.request_ids]
        b = len(ordered)
        ids = np.array([[i.token_ids[0]] for i in ordered], np.int64)
        mask = np.concatenate([view.mask, np.ones((b, 1), np.int64)], axis=1)
        positions = np.array([[n] for n in view.lengths], np.int64)
        logits, present = self._run(ids, mask, positions, view.past)
        tables = [i.block_table for i in ordered]
        self.storage.scatter(tables, view.lengths, [1] * b, present, view.width)
        views[key] = _DecodeView(view.request_ids, [n + 1 for n in view.lengths], mask, present)
        return StepLogits(view.request_ids, logits[:, 0])

    def _assemble(self, items: Sequence[StepItem]) -> _DecodeView:
        """A decode view for a new membership: rows of sequences that decoded last step
        are copied from that step's view (one vectorised take per tensor), the others are
        gathered from the pool; kept rows first, in their old order."""
        found: dict[str, tuple[_DecodeView, int]] = {}
        for old in self._views.values():
            for row, rid in enumerate(old.request_ids):
                found[rid] = (old, row)
        kept: dict[int, tuple[_DecodeView, list[StepItem], list[int]]] = {}
        fresh: list[StepItem] = []
        for item in items:
            source = found.get(item.request_id)
            if source is not None and source[0].lengths[source[1]] == item.start:
                group = kept.setdefault(id(source[0]), (source[0], [], []))
                group[1].append(item)
                group[2].append(source[1])
            else:
                fresh.append(item)
        ordered = [i for _, members, _ in kept.values() for i in members] + fresh
        lengths = [i.start for i in ordered]
        width = max(lengths)
        tensors = 2 * self._layers
        out = [self._empty_like_past(len(ordered), width) for _ in range(tensors)]
        start = 0
        for old, _, rows in kept.values():
            index = np.array(rows, np.intp)
            for j in range(tensors):
                src = old.past[j // 2][j % 2]
                _copy_rows(src, index, out[j][start : start + len(rows)])
            start += len(rows)
        if fresh:
            gathered = self.storage.gather(
                [i.block_table for i in fresh], [i.start for i in fresh], width
            )
            for j in range(tensors):
                out[j][start:] = gathered[j // 2][j % 2]
        mask = (np.arange(width)[None, :] >= width - np.array(lengths)[:, None]).astype(np.int64)
        past = [(out[2 * k], out[2 * k + 1]) for k in range(self._layers)]
        return _DecodeView([i.request_id for i in ordered], lengths, mask, past)

    def _empty_like_past(self, batch: int, width: int) -> np.ndarray:
        shape = self.storage.shape
        return np.empty((batch, shape.kv_heads, width, shape.head_dim), shape.dtype)


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
