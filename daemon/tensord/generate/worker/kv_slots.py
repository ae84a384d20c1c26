"""The bytes of the KV slots: per layer, one key and one value buffer, allocated once.

Layer i's buffers are [num_slots, kv_heads, length_i, head_dim] in the model's KV dtype,
where the model runs: host memory for the CPU provider, device memory (ONNX Runtime's own
CUDA allocator, through OrtValue) for the CUDA provider. Slot s of a layer is the
contiguous slab [kv_heads, length_i, head_dim] at s * slab bytes, which is how fused
attention (GroupQueryAttention) reads a batch row's past. A pass over rows 0..n-1 binds
each buffer's base address with shape [n, ...] as both the past input and the present
output, so the kernel sees one buffer and appends in place (slot_runner.py).

length_i is the sequence length (max_model_len) for a layer of full attention, and the
window (plus slack) for a layer the builder gave a window-sized cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from tensord.errors import ModelLoadError
from tensord.generate.core.slot_manager import SlotMove


@dataclass(slots=True, frozen=True)
class SlotLayout:
    """What one slot looks like in a model."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: np.dtype
    lengths: tuple[int, ...]
    """Positions each layer's slot holds."""

    def layer_slab_bytes(self, layer: int) -> int:
        """Bytes of one slot's keys (or values) in one layer."""
        return self.kv_heads * self.lengths[layer] * self.head_dim * self.dtype.itemsize

    @property
    def slot_bytes(self) -> int:
        """Keys and values of every layer for one slot."""
        return 2 * sum(self.layer_slab_bytes(i) for i in range(self.num_layers))


class SlotStorage:
    """Every layer's key and value buffers for `num_slots` slots on one device."""

    def __init__(
        self, layout: SlotLayout, num_slots: int, device: str = "cpu", device_id: int = 0
    ) -> None:
        self.layout = layout
        self.num_slots = num_slots
        self.device = device
        self.device_id = device_id
        self._keep: list[object] = []
        """The allocations (NumPy arrays or OrtValues): alive as long as the storage."""
        self.pointers: list[tuple[int, int]] = []
        """(key address, value address) of each layer's buffer."""
        for layer in range(layout.num_layers):
            shape = [num_slots, layout.kv_heads, layout.lengths[layer], layout.head_dim]
            self.pointers.append((self._allocate(shape), self._allocate(shape)))

    def _allocate(self, shape: list[int]) -> int:
        if self.device == "cpu":
            array = np.empty(shape, self.layout.dtype)
            array.fill(0)  # commit the pages now, not as sequences fill them
            self._keep.append(array)
            return int(array.ctypes.data)
        try:
            value = ort.OrtValue.ortvalue_from_shape_and_type(
                shape, self.layout.dtype, self.device, self.device_id
            )
        except Exception as exc:
            raise ModelLoadError(
                f"cannot allocate the KV slots on {self.device}:{self.device_id} "
                f"({np.prod(shape) * self.layout.dtype.itemsize / 2**20:.1f} MiB a buffer): {exc}"
            ) from None
        self._keep.append(value)
        return int(value.data_ptr())

    @property
    def nbytes(self) -> int:
        """Bytes held by every buffer."""
        return self.num_slots * self.layout.slot_bytes

    def shape(self, layer: int, rows: int) -> list[int]:
        """The bound shape of layer `layer` for a pass over `rows` slots."""
        lay = self.layout
        return [rows, lay.kv_heads, lay.lengths[layer], lay.head_dim]

    def address(self, layer: int, kind: int, slot: int) -> int:
        """Where slot `slot` of layer `layer`'s keys (kind 0) or values (kind 1) starts."""
        return self.pointers[layer][kind] + slot * self.layout.layer_slab_bytes(layer)

    def host_view(self, layer: int, kind: int) -> np.ndarray:
        """A host buffer as NumPy [num_slots, kv_heads, length, head_dim] (CPU only)."""
        if self.device != "cpu":
            raise ValueError("device slots have no host view")
        array = self._keep[2 * layer + kind]
        assert isinstance(array, np.ndarray)
        return array

    def apply_moves(self, moves: Sequence[SlotMove]) -> None:
        """Copy each moved sequence's slot into its new one in every layer, in order; done
        when this returns (on a device too: a device-to-device cudaMemcpy returns before it
        lands, on the legacy stream, which ONNX Runtime's non-blocking compute stream does
        not wait for)."""
        for move in moves:
            for layer in range(self.layout.num_layers):
                size = self.layout.layer_slab_bytes(layer)
                for kind in (0, 1):
                    if self.device == "cpu":
                        view = self.host_view(layer, kind)
                        view[move.target] = view[move.source]
                    else:
                        source = self.address(layer, kind, move.source)
                        _device_copy(self.address(layer, kind, move.target), source, size)
        if moves and self.device != "cpu":
            from cuda.bindings import runtime as cudart

            from tensord.cuda.runtime import check

            check(cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def _device_copy(dst: int, src: int, nbytes: int) -> None:
    """A device-to-device copy (queued: apply_moves waits for it)."""
    from cuda.bindings import runtime as cudart

    from tensord.cuda.runtime import check

    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    check(cudart.cudaMemcpy(dst, src, nbytes, kind), "cudaMemcpy")
