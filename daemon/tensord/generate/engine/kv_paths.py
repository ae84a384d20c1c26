"""The two ways an engine holds its KV cache, behind one record the engine runs.

slots   fused attention (GroupQueryAttention, as ONNX Runtime GenAI's model builder
        emits it): each running sequence owns a slot of per-layer buffers, bound as
        past and present at once; a step never moves the cache (core/slot_manager.py,
        worker/kv_slots.py, worker/slot_runner.py). Prefixes are reused through a host
        store, copied between steps (core/slot_prefix.py, worker/prefix_store.py).
paged   Optimum exports (Concat-growing pasts): a paged block pool in host memory with
        prefix reuse and preemption; each pass gathers and scatters pasts
        (core/kv_cache_manager.py, worker/kv_storage.py, worker/model_runner.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tensord.generate.core.block_pool import KVCacheBlock
from tensord.generate.core.kv_cache_manager import KVCacheManager
from tensord.generate.core.scheduler import KVAllocator
from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.core.slot_manager import SlotManager, SlotMove
from tensord.generate.core.slot_prefix import PrefixCopy, PrefixLoad, SlotPrefixIndex
from tensord.generate.model.batch_layout import LayoutChoice
from tensord.generate.model.model_dir import GeneratorSpec
from tensord.generate.model.serving_graph import PAGED_REASON
from tensord.generate.model.slot_graph import RAGGED_REASON, SLOTS_REASON
from tensord.generate.worker.kv_slots import SlotStorage
from tensord.generate.worker.kv_storage import HostKVStorage, KVShape
from tensord.generate.worker.model_runner import ModelRunner, PassStats, StepLogits
from tensord.generate.worker.prefix_store import PrefixReuse, PrefixStore
from tensord.generate.worker.slot_runner import SlotRunner
from tensord.modelconfig.generator import BatchLayout, GeneratorLimits

RunFn = Callable[[Mapping[str, np.ndarray], Sequence[str]], list[np.ndarray]]


class StepRunner(Protocol):
    """A runner of engine steps (ModelRunner, SlotRunner)."""

    stats: PassStats

    def execute(
        self, items: Sequence[ScheduledRequest], before_run: Callable[[], None] | None = None
    ) -> StepLogits: ...

    def reset(self) -> None: ...


@dataclass(slots=True)
class KVPath:
    """An engine's KV cache: the scheduler's allocator, the step runner, the bytes."""

    name: str
    """"slots" or "paged"."""
    reason: str
    """Why the model got this path, in words for the log and Info."""
    kv_cache_manager: KVAllocator
    runner: StepRunner
    nbytes: int
    """Bytes the KV cache holds (allocated at load)."""
    layout: LayoutChoice
    slots: SlotManager | None = None
    storage: SlotStorage | HostKVStorage | None = field(default=None, repr=False)
    prefix_store: PrefixStore | None = field(default=None, repr=False)
    """The host prefix store of the slots (None: prefixes are not reused)."""

    def take_moves(self) -> list[SlotMove]:
        """Slot moves to apply before the next step (none on the paged path)."""
        return self.slots.take_moves() if self.slots is not None else []

    def apply_moves(self, moves: Sequence[SlotMove]) -> None:
        """The bytes of `moves` (take_moves') copied, before the step that reads them."""
        if moves:
            assert isinstance(self.storage, SlotStorage), "moves come from slots only"
            self.storage.apply_moves(moves)

    def take_loads(self) -> list[PrefixLoad]:
        """Prefix copies into slots that the scheduled step needs (engine lock held)."""
        if self.slots is None or self.slots.prefix is None:
            return []
        return self.slots.prefix.take_loads()

    def apply_loads(self, loads: Sequence[PrefixLoad]) -> None:
        """The bytes of `loads` copied into their slots, before the step's passes."""
        if loads:
            assert self.prefix_store is not None and isinstance(self.storage, SlotStorage)
            self.prefix_store.load(self.storage, [load.copy for load in loads])

    def loads_done(self, loads: Sequence[PrefixLoad]) -> None:
        """The store blocks of `loads` may be evicted again (engine lock held)."""
        if loads and self.slots is not None and self.slots.prefix is not None:
            self.slots.prefix.loaded(loads)

    def take_saves(self) -> tuple[list[PrefixCopy], list[tuple[KVCacheBlock, bytes]]]:
        """Blocks a step computed that are owed to the prefix store, and the store blocks
        they fill with their hashes (engine lock held; pass them to `saved`)."""
        if self.slots is None or self.slots.prefix is None:
            return [], []
        return self.slots.prefix.take_saves()

    def apply_saves(self, saves: Sequence[PrefixCopy]) -> None:
        """The bytes of `saves` copied into the store, before any slot changes hands."""
        if saves:
            assert self.prefix_store is not None and isinstance(self.storage, SlotStorage)
            self.prefix_store.save(self.storage, saves)

    def saved(self, saving: Sequence[tuple[KVCacheBlock, bytes]], done: bool) -> None:
        """take_saves' blocks copied (`done`: found under their hashes from now on) or not;
        either way free again (engine lock held)."""
        if saving and self.slots is not None and self.slots.prefix is not None:
            self.slots.prefix.saved(saving, done)

    def discard_saves(self) -> None:
        """Forget saves owed by a step that failed (engine lock held)."""
        self.saved(self.take_saves()[1], done=False)

    def close(self) -> None:
        """Give back what the engine's loop held (the prefix store's page-locked memory)."""
        if self.prefix_store is not None:
            self.prefix_store.close()

    @property
    def slot_bytes(self) -> int:
        """One slot's bytes (0 on the paged path)."""
        if isinstance(self.storage, SlotStorage):
            return self.storage.layout.slot_bytes
        return 0


def paged_kv_path(
    spec: GeneratorSpec,
    limits: GeneratorLimits,
    run: RunFn,
    layout: LayoutChoice,
    position_ids: bool,
) -> KVPath:
    """The paged block pool and the gather/scatter runner of an Optimum export."""
    shape = KVShape(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.kv_dtype.numpy)
    storage = HostKVStorage(shape, limits.num_blocks, limits.block_size)
    runner = ModelRunner(
        run,
        storage,
        spec.num_layers,
        position_ids,
        pad_token_id=spec.pad_token_id if spec.pad_token_id is not None else 0,
        layout=layout.layout,
    )
    return KVPath(
        name="paged",
        reason=PAGED_REASON,
        kv_cache_manager=KVCacheManager(limits.num_blocks, limits.block_size),
        runner=runner,
        nbytes=storage.nbytes,
        layout=layout,
        storage=storage,
    )


def slot_kv_path(
    runner: SlotRunner,
    max_model_len: int,
    reason: str = "",
    prefix: PrefixReuse | None = None,
) -> KVPath:
    """KV slots of `runner`'s storage (one per sequence of up to max_model_len tokens);
    `reason`: why this model is on them (default: its graph's attention is fused);
    `prefix`: the host store that keeps prefixes for reuse, None for none."""
    storage = runner.storage
    index = None
    if prefix is not None:
        store = prefix.store
        index = SlotPrefixIndex(store.num_blocks, store.block_size, prefix.held_tokens)
    slots = SlotManager(storage.num_slots, max_model_len, index)
    return KVPath(
        name="slots",
        reason=reason or SLOTS_REASON,
        kv_cache_manager=slots,
        runner=runner,
        nbytes=storage.nbytes,
        layout=LayoutChoice(BatchLayout.RAGGED, RAGGED_REASON),
        slots=slots,
        storage=storage,
        prefix_store=prefix.store if prefix is not None else None,
    )
