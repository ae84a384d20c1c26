"""One engine step on a fused-attention graph whose KV cache stays in its slots.

The graph (an ONNX Runtime GenAI builder's, one GroupQueryAttention per layer) reads row
b's past as the contiguous slab of its slot and bounds its attention by the count of ones
in row b of the attention mask (seqlens_k = count - 1): tokens sit at positions
0..len-1 of their row, padding never enters the past, and rows of any lengths share a
pass. Past and present are bound to the same addresses (kv_slots.py), so the kernel
writes the new keys and values in place and a step moves only token ids, the mask and
logits.

A step runs:
  * prompts that start this step (admitted together into the consecutive free slots
    above the held ones) in one pass, right-padded, each row's mask counting its own
    length, rows x width within max_pass_tokens (only equal lengths share a pass where a
    layer's cache is window-sized: padding would take window positions); a chunk that
    continues a prompt over its past at batch 1 (a multi-token step over an existing past
    cannot share a pass);
  * one decode pass over the decoding slots, which the slot manager keeps packed low. A
    held slot that does not decode this step (its prompt is still being prefilled, or it
    sampled its first token this step) is never written: it splits the pass into runs of
    consecutive decoding slots around it (a window-sized cache would evict a position for
    a pad token), which happens only while such a slot sits below a decoding one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.worker.kv_slots import SlotStorage
from tensord.generate.worker.model_runner import PassStats, StepLogits, is_decode


class BoundSession(Protocol):
    """What the runner needs of the backend: IOBinding runs (OnnxRuntimeBackend)."""

    def io_binding(self) -> Any: ...
    def run_binding(self, binding: Any) -> None: ...


class SlotRunner:
    """Runs steps of one builder-layout decoder over its KV slots."""

    def __init__(
        self,
        session: BoundSession,
        storage: SlotStorage,
        *,
        logits_dtype: np.dtype,
        vocab_size: int,
        has_position_ids: bool = False,
        pad_prompts: bool = True,
        max_pass_tokens: int = 2048,
    ) -> None:
        """`pad_prompts`: whether first prompts of different lengths may share a pass
        right-padded (not for a model whose layers have window-sized caches).
        `max_pass_tokens` bounds rows x width of such a pass (padding counted: a builder
        graph computes logits for every position)."""
        self._session = session
        self.storage = storage
        self._logits_dtype = logits_dtype
        self._vocab = vocab_size
        self._positions = has_position_ids
        self._decode_bindings: dict[tuple[int, int], Any] = {}
        """Per (first slot, rows): a binding with the slots bound (logits into their rows
        of _logits)."""
        self._logits = np.empty((storage.num_slots, 1, vocab_size), logits_dtype)
        """Decode logits, row s for slot s: one buffer whatever the runs."""
        self._max_pass_tokens = max_pass_tokens
        self._prefill_bindings: dict[tuple[int, int], Any] = {}
        self.stats = PassStats()
        self._before_run: Callable[[], None] | None = None
        self._first_prompts_join = _always if pad_prompts else _equal_lengths
        """Whether two first prompts may share a pass: any lengths (right-padded), but
        only equal ones where a layer's cache is window-sized (padding would take window
        positions)."""

    def execute(
        self, items: Sequence[ScheduledRequest], before_run: Callable[[], None] | None = None
    ) -> StepLogits:
        """Run a step's scheduled requests; the last-position logits of each that samples.
        `before_run` is called once, just before the first pass starts."""
        self._before_run = before_run
        decodes = [item for item in items if is_decode(item)]
        prefills = [item for item in items if not is_decode(item)]
        firsts = [item for item in prefills if item.start_pos == 0]
        runs = _slot_runs(firsts, self._first_prompts_join, self._max_pass_tokens)
        parts = [self._prefill(run) for run in runs]
        parts += [self._prefill([item]) for item in prefills if item.start_pos > 0]
        if decodes:
            parts += [self._decode_run(run) for run in _slot_runs(decodes, _always, None)]
        return StepLogits.join(parts)

    def reset(self) -> None:
        """Nothing is kept between steps: the slots hold all there is."""

    def _run(self, binding: Any, sequences: int) -> None:
        if self._before_run is not None:
            before, self._before_run = self._before_run, None
            before()
        self.stats.count(sequences)
        start = time.perf_counter()
        self._session.run_binding(binding)
        self.stats.timed(start)

    def _bind_slots(self, binding: Any, first: int, rows: int) -> None:
        """Past and present of every layer: the same addresses, rows first.. first+rows-1."""
        storage = self.storage
        dtype = storage.layout.dtype
        for layer in range(storage.layout.num_layers):
            shape = storage.shape(layer, rows)
            for kind, (past, present) in enumerate(_names(layer)):
                address = storage.address(layer, kind, first)
                where = (storage.device, storage.device_id, dtype, shape, address)
                binding.bind_input(past, *where)
                binding.bind_output(present, *where)

    def _prefill(self, items: Sequence[ScheduledRequest]) -> StepLogits:
        """Prompt chunks in their slots: first prompts of consecutive slots in one pass
        (right-padded: each row's count of mask ones is its own length), a chunk that
        continues a prompt at batch 1."""
        first, rows = items[0].block_ids[0], len(items)
        binding = self._prefill_bindings.get((first, rows))
        if binding is None:
            binding = self._session.io_binding()
            binding.bind_output("logits", "cpu")  # first: get_outputs()[0]
            self._bind_slots(binding, first, rows)
            self._prefill_bindings[(first, rows)] = binding
        counts = np.fromiter((len(item.token_ids) for item in items), np.int64, rows)
        width = int(counts.max())
        ids = np.zeros((rows, width), np.int64)
        for row, item in enumerate(items):
            ids[row, : counts[row]] = item.token_ids
        start = items[0].start_pos  # 0 for a batch: only first prompts share a pass
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", _mask(start + counts))
        if self._positions:
            positions = np.minimum(np.arange(width)[None, :], counts[:, None] - 1) + start
            binding.bind_cpu_input("position_ids", positions)
        self._run(binding, rows)
        wanted = [row for row, item in enumerate(items) if item.sample]
        last = np.zeros((0, self._vocab), self._logits_dtype)
        if wanted:
            last = binding.get_outputs()[0].numpy()[wanted, counts[wanted] - 1]  # a copy
        # A fresh output for the next run: the binding lets this one go (and would keep
        # its shape, which the next run's need not have).
        binding.bind_output("logits", "cpu")
        return StepLogits([items[row].request_id for row in wanted], last)

    def _decode_binding(self, first: int, rows: int) -> Any:
        binding = self._decode_bindings.get((first, rows))
        if binding is None:
            binding = self._session.io_binding()
            self._bind_slots(binding, first, rows)
            address = self._logits.ctypes.data + first * self._logits[0].nbytes
            shape = [rows, 1, self._vocab]
            binding.bind_output("logits", "cpu", 0, self._logits.dtype, shape, address)
            self._decode_bindings[(first, rows)] = binding
        return binding

    def _decode_run(self, items: Sequence[ScheduledRequest]) -> StepLogits:
        """One pass over the consecutive slots of `items` (sorted by slot)."""
        first, rows = items[0].block_ids[0], len(items)
        ids = np.fromiter((item.token_ids[0] for item in items), np.int64, rows)[:, None]
        lengths = np.fromiter((item.start_pos for item in items), np.int64, rows)
        binding = self._decode_binding(first, rows)
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", _mask(lengths + 1))
        if self._positions:
            binding.bind_cpu_input("position_ids", lengths[:, None].copy())
        self._run(binding, rows)
        # A view of the slots' rows of the logits buffer: the engine samples from it before
        # the next step's passes write it (StepLogits.join copies when a step has several).
        return StepLogits(
            [item.request_id for item in items], self._logits[first : first + rows, 0]
        )


def _mask(counts: np.ndarray) -> np.ndarray:
    """The attention mask [rows, max(counts)]: row r's first counts[r] columns 1. The
    graph reads only each row's count (its length) and the width (the longest)."""
    return (np.arange(int(counts.max()))[None, :] < counts[:, None]).astype(np.int64)


def _always(_a: ScheduledRequest, _b: ScheduledRequest) -> bool:
    return True


def _equal_lengths(a: ScheduledRequest, b: ScheduledRequest) -> bool:
    return len(a.token_ids) == len(b.token_ids)


def _slot_runs(
    items: Sequence[ScheduledRequest],
    joins: Callable[[ScheduledRequest, ScheduledRequest], bool],
    max_cells: int | None,
) -> list[list[ScheduledRequest]]:
    """`items` sorted by slot, cut into runs of consecutive slots, and where `joins` says
    two neighbours cannot share a pass or the run's rows x widest would pass `max_cells`."""
    ordered = sorted(items, key=lambda item: item.block_ids[0])
    runs: list[list[ScheduledRequest]] = []
    widest = 0
    for item in ordered:
        last = runs[-1][-1] if runs else None
        width = max(widest, len(item.token_ids))
        if (
            last is not None
            and item.block_ids[0] == last.block_ids[0] + 1
            and joins(last, item)
            and (max_cells is None or (len(runs[-1]) + 1) * width <= max_cells)
        ):
            runs[-1].append(item)
            widest = width
        else:
            runs.append([item])
            widest = len(item.token_ids)
    return runs


def _names(layer: int) -> tuple[tuple[str, str], tuple[str, str]]:
    """(past, present) names of a layer's keys and of its values."""
    return (
        (f"past_key_values.{layer}.key", f"present.{layer}.key"),
        (f"past_key_values.{layer}.value", f"present.{layer}.value"),
    )
