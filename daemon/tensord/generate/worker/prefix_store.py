"""The bytes of the host prefix store, and the copies between it and the KV slots.

One allocation of [num_blocks, num_layers, 2, kv_heads, block_size, head_dim] in the
model's KV dtype, in host memory (page-locked when the slots are on a CUDA device, so the
copies run at full speed). Block b holds block_size consecutive positions of one
sequence's keys (kind 0) and values (kind 1) in every layer; core/slot_prefix.py decides
which.

A copy moves whole blocks between a store block and a slot's positions. Into a slot, a
layer that attends over a sliding window gets only the blocks its window can still reach
from the end of the copied prefix: positions before it are masked out of every later
token's attention and are never read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensord.generate.core.slot_prefix import PrefixCopy
from tensord.generate.worker.kv_slots import SlotLayout, SlotStorage


class PrefixStore:
    """Host blocks for reused prefixes, and the copies to and from `SlotStorage`."""

    def __init__(
        self,
        layout: SlotLayout,
        num_blocks: int,
        block_size: int,
        windows: Sequence[int | None],
        pinned: bool = False,
    ) -> None:
        """`windows`: each layer's sliding window (None: full attention). `pinned`: take
        page-locked memory (cudaHostAlloc) for copies to and from a device."""
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.windows = tuple(windows)
        shape = (num_blocks, layout.num_layers, 2, layout.kv_heads, block_size, layout.head_dim)
        self._pinned = None
        if pinned:
            from tensord.cuda.memory import _pinned_alloc

            nbytes = int(np.prod(shape)) * layout.dtype.itemsize
            self._pinned = _pinned_alloc(nbytes)
            self.blocks = self._pinned.view(layout.dtype, shape)
        else:
            # Pages are committed as blocks are first written: a store fills over time.
            self.blocks = np.empty(shape, layout.dtype)
        self.bytes_loaded = 0
        """Bytes copied from the store into slots since start."""
        self.bytes_saved = 0
        """Bytes copied from slots into the store since start."""

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def block_bytes(self) -> int:
        """One block's keys and values, every layer."""
        lay = self.layout
        return (
            2 * lay.num_layers * lay.kv_heads * self.block_size * lay.head_dim * lay.dtype.itemsize
        )

    def close(self) -> None:
        """Give page-locked memory back (the store is unusable afterwards)."""
        if self._pinned is not None:
            from tensord.cuda.memory import _pinned_free

            pinned, self._pinned = self._pinned, None
            del self.blocks
            _pinned_free(pinned)

    def save(self, storage: SlotStorage, copies: Sequence[PrefixCopy]) -> None:
        """Copy each copy's slot blocks into its store blocks, every layer."""
        _synchronise(storage, copies)  # the passes that wrote them have finished
        for copy in copies:
            for layer in range(self.layout.num_layers):
                blocks = list(range(len(copy.store_blocks)))
                self._copy(storage, copy, layer, blocks, into_slot=False)
        _synchronise(storage, copies)

    def load(self, storage: SlotStorage, copies: Sequence[PrefixCopy]) -> None:
        """Copy each copy's store blocks into its slot (a windowed layer: only the blocks
        its window reaches from the prefix's end)."""
        for copy in copies:
            count = len(copy.store_blocks)
            end = (copy.first_block + count) * self.block_size
            for layer in range(self.layout.num_layers):
                window = self.windows[layer]
                start = 0
                if window is not None:
                    # One position of slack: whichever way the kernel counts its window.
                    reach = max(0, end - window - 1)
                    start = max(0, reach // self.block_size - copy.first_block)
                self._copy(storage, copy, layer, list(range(start, count)), into_slot=True)
        _synchronise(storage, copies)

    def _copy(
        self,
        storage: SlotStorage,
        copy: PrefixCopy,
        layer: int,
        indices: list[int],
        *,
        into_slot: bool,
    ) -> None:
        """Blocks copy.store_blocks[i] for i in `indices` (consecutive) and the slot's
        positions they stand for, one way or the other, keys and values."""
        if not indices:
            return
        size = self.block_size
        lay = self.layout
        ids = np.asarray([copy.store_blocks[i] for i in indices], np.intp)
        first = (copy.first_block + indices[0]) * size
        last = first + len(indices) * size
        nbytes = 2 * len(indices) * int(self.blocks[0, 0, 0].nbytes)
        if into_slot:
            self.bytes_loaded += nbytes
        else:
            self.bytes_saved += nbytes
        for kind in (0, 1):
            if storage.device == "cpu":
                view = storage.host_view(layer, kind)[copy.slot, :, first:last]
                if into_slot:  # [n, heads, size, dim] -> [heads, n * size, dim]
                    stored = self.blocks[ids, layer, kind]
                    view[...] = stored.transpose(1, 0, 2, 3).reshape(view.shape)
                else:
                    heads, _, dim = view.shape
                    parts = view.reshape(heads, len(indices), size, dim).transpose(1, 0, 2, 3)
                    self.blocks[ids, layer, kind] = parts
                continue
            row = lay.head_dim * lay.dtype.itemsize
            slot_pitch = lay.lengths[layer] * row
            for n, block in enumerate(ids):
                at = storage.address(layer, kind, copy.slot) + (first + n * size) * row
                host = self.blocks[block, layer, kind].ctypes.data
                if into_slot:
                    _copy_2d(at, slot_pitch, host, size * row, size * row, lay.kv_heads, True)
                else:
                    _copy_2d(host, size * row, at, slot_pitch, size * row, lay.kv_heads, False)


def _copy_2d(
    dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, to_device: bool
) -> None:
    """`height` rows of `width` bytes between page-locked host memory and a device (the
    engine thread's current one: _synchronise sets it)."""
    from cuda.bindings import runtime as cudart

    from tensord.cuda.runtime import check

    kind = (
        cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        if to_device
        else cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
    )
    check(cudart.cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, height, kind), "cudaMemcpy2D")


def _synchronise(storage: SlotStorage, copies: Sequence[PrefixCopy]) -> None:
    """On a device, wait for all work queued so far (ONNX Runtime's compute stream and
    the legacy stream the copies run on do not wait for each other)."""
    if copies and storage.device != "cpu":
        from cuda.bindings import runtime as cudart

        from tensord.cuda.runtime import check

        check(cudart.cudaSetDevice(storage.device_id), "cudaSetDevice")
        check(cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


@dataclass(slots=True, frozen=True)
class PrefixReuse:
    """A prefix store for KV slots, and how long a slot holds positions as they are (a
    ring of a sliding window overwrites them past that; None: the whole slot)."""

    store: PrefixStore
    held_tokens: int | None
