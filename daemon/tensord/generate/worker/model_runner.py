"""One engine step on the model: gather the past from the KV pool, run, scatter, logits.

A step's scheduled requests (the scheduler's records, as they are) are cut into model
passes by the model's batch layout (batch_layout.py): all of them in one pass (padded), one
pass per past length (equal_length), or one pass each (single). Pasts are right-aligned: a
shorter sequence's padding comes first, carries attention_mask 0, and the step's new tokens
follow each sequence's own last position, so key offsets within a sequence are what they
are alone; position_ids are each sequence's real positions.

Prefill chunks (several tokens per sequence, ragged, right-padded) run over a past
gathered from the pool. Decode passes keep a persistent view each (decode_view.py): the
model's `present` outputs are the next step's past as they are, only the new token's keys
and values are written to the pool, and sequences that join or leave the padded pass
change rows in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.worker.decode_view import DecodeView, assemble, patch
from tensord.generate.worker.kv_storage import KVStorage
from tensord.modelconfig.generator import BatchLayout


def is_decode(item: ScheduledRequest) -> bool:
    """One token after cached ones, whose logits are wanted: a decode step (or the last
    token of a prompt whose other tokens were cached). A one-token prompt chunk that does
    not end its prompt is a prefill: the decode path gives every row's logits."""
    return len(item.token_ids) == 1 and item.start_pos > 0 and item.sample


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

    @classmethod
    def join(cls, parts: Sequence[StepLogits]) -> StepLogits:
        """The logits of a step's passes, in order, as one."""
        if len(parts) == 1:
            return parts[0]
        ids = [i for part in parts for i in part.request_ids]
        rows = [part.rows for part in parts if len(part.request_ids)]
        return cls(ids, np.concatenate(rows) if rows else np.zeros((0, 0), np.float32))

    def __len__(self) -> int:
        return len(self.request_ids)


@dataclass(slots=True)
class PassStats:
    """Model passes run so far and the sequences they carried (shown by Info)."""

    passes: int = 0
    sequences: int = 0
    """Sequences summed over passes: sequences / passes is the mean batch."""
    max_sequences: int = 0
    """The most sequences one pass carried."""
    run_seconds: float = 0.0
    """Time inside the model's passes."""

    def count(self, batch: int) -> None:
        self.passes += 1
        self.sequences += batch
        self.max_sequences = max(self.max_sequences, batch)

    def timed(self, start: float) -> None:
        """Add a pass that began at perf_counter() `start` and just ended."""
        self.run_seconds += time.perf_counter() - start


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
        self._views: dict[frozenset[str], DecodeView] = {}
        """Last step's decode views: the padded layout's one under _PADDED, the others under
        their request ids."""
        self._before_run: Callable[[], None] | None = None

    def execute(
        self, items: Sequence[ScheduledRequest], before_run: Callable[[], None] | None = None
    ) -> StepLogits:
        """Run a step's scheduled requests (SchedulerOutput.scheduled, as the scheduler
        made them); the last-position logits [V] of each one that samples.

        `before_run` is called once, just before the first model pass starts (the engine
        hands the previous step's tokens to the event loop there, so that the loop's work
        overlaps the pass, which runs without the GIL)."""
        self._before_run = before_run
        decodes: list[ScheduledRequest] = []
        prefills: list[ScheduledRequest] = []
        for item in items:
            (decodes if is_decode(item) else prefills).append(item)
        parts = [self._prefill(group) for group in self._passes(prefills)]
        views: dict[frozenset[str], DecodeView] = {}
        parts.extend(self._decode(group, views) for group in self._passes(decodes))
        self._views = views
        return StepLogits.join(parts)

    def reset(self) -> None:
        """Forget the decode views (after preemption, aborts or errors)."""
        self._views = {}

    def _passes(self, items: list[ScheduledRequest]) -> list[list[ScheduledRequest]]:
        """The items cut into model passes as the layout allows."""
        if not items:
            return []
        if self.layout is BatchLayout.PADDED:
            return [items]
        if self.layout is BatchLayout.SINGLE:
            return [[item] for item in items]
        by_start: dict[int, list[ScheduledRequest]] = {}
        for item in items:
            by_start.setdefault(item.start_pos, []).append(item)
        return list(by_start.values())

    def _run(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        past: Sequence[np.ndarray],
        sequences: int | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One model pass; `sequences` counts the rows that hold one (all by default)."""
        feeds: dict[str, np.ndarray] = {"input_ids": ids, "attention_mask": mask}
        if self._has_positions:
            feeds["position_ids"] = positions
        for i in range(self._layers):
            feeds[f"past_key_values.{i}.key"] = past[2 * i]
            feeds[f"past_key_values.{i}.value"] = past[2 * i + 1]
        if self._before_run is not None:
            before, self._before_run = self._before_run, None
            before()
        self.stats.count(len(ids) if sequences is None else sequences)
        start = time.perf_counter()
        out = self._run_model(feeds, ["logits", *self._present_names])
        self.stats.timed(start)
        return out[0], out[1:]

    def _prefill(self, items: Sequence[ScheduledRequest]) -> StepLogits:
        b = len(items)
        width = max(i.start_pos for i in items)
        t_max = max(len(i.token_ids) for i in items)
        ids = np.full((b, t_max), self._pad, np.int64)
        mask = np.zeros((b, width + t_max), np.int64)
        positions = np.zeros((b, t_max), np.int64)
        for row, item in enumerate(items):
            n = len(item.token_ids)
            ids[row, :n] = item.token_ids
            mask[row, width - item.start_pos : width + n] = 1
            positions[row] = item.start_pos + np.minimum(np.arange(t_max), n - 1)
        tables = [i.block_ids for i in items]
        past = self.storage.reserve(b, width)
        self.storage.gather(tables, [i.start_pos for i in items], past)
        logits, present = self._run(ids, mask, positions, past)
        counts = [len(i.token_ids) for i in items]
        self.storage.scatter(tables, [i.start_pos for i in items], counts, present, width)
        wanted = [row for row, item in enumerate(items) if item.sample]
        last = np.array([counts[row] - 1 for row in wanted], np.int64)
        return StepLogits([items[row].request_id for row in wanted], logits[wanted, last])

    def _decode(
        self, items: Sequence[ScheduledRequest], views: dict[frozenset[str], DecodeView]
    ) -> StepLogits:
        """One decode pass over a view of the items' pasts (rows in the view's order, free
        rows fed a masked pad token); the next view goes into `views`."""
        by_id = {i.request_id: i for i in items}
        key = _PADDED if self.layout is BatchLayout.PADDED else frozenset(by_id)
        view = self._views.get(key)
        if view is not None:
            view = patch(view, by_id, self.storage, free_rows=key is _PADDED)
        if view is None:
            view = assemble(items, self._views.values(), self.storage)
        active = view.active()
        ordered = [by_id[view.request_ids[r]] for r in active]  # type: ignore[index]
        b = len(view.request_ids)
        ids = np.full((b, 1), self._pad, np.int64)
        ids[active, 0] = [i.token_ids[0] for i in ordered]
        mask = np.concatenate([view.mask, np.ones((b, 1), np.int64)], axis=1)
        positions = np.array(view.lengths, np.int64)[:, None]
        logits, present = self._run(ids, mask, positions, view.past, len(active))
        starts = [view.lengths[r] for r in active]
        tables = [i.block_ids for i in ordered]
        self.storage.scatter(tables, starts, [1] * len(active), present, view.width, rows=active)
        lengths = [
            n + 1 if rid is not None else 0
            for rid, n in zip(view.request_ids, view.lengths, strict=True)
        ]
        views[key] = DecodeView(list(view.request_ids), lengths, mask, present)
        return StepLogits([i.request_id for i in ordered], logits[active, 0])


_PADDED: frozenset[str] = frozenset({"\0padded"})
"""The key of the padded layout's single decode view."""
