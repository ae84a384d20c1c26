"""Launchers for every kernel on device memory, on a given stream (the lane's).

Each mirrors its NumPy twin's signature with DeviceArray in place of ndarray; shapes and
dtypes are checked on the host before the launch, and launches are checked.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from tensord.kernels.driver import Arg, DeviceKernels, f32, i32, i64, pointer
from tensord.kernels.image import Layout, LetterboxGeometry, Normalisation, resize_scale
from tensord.kernels.nms import MAX_CANDIDATES, NmsSettings

IMAGE_BLOCK_X = 128
TOPK_THREADS = 256
TOPK_MAX_CACHED_BYTES = 40 * 1024
NMS_THREADS = 512
KV_THREADS = 256
GRID_Y_MAX = 65535


@dataclass(slots=True, frozen=True)
class DeviceArray:
    """A C-contiguous array in device memory."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        """Its size in bytes."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class _Normalise(ctypes.Structure):
    """struct Normalise in kernels/image_common.cuh."""

    _fields_ = [
        *((f"mean{c}", ctypes.c_float) for c in range(3)),
        *((f"inv_std{c}", ctypes.c_float) for c in range(3)),
        *((f"src{c}", ctypes.c_int) for c in range(3)),
    ]


def _normalise(norm: Normalisation) -> Arg:
    return (_Normalise(*norm.mean, *norm.inv_std, *norm.source_channels), None)


def _suffix(dtype: np.dtype) -> str:
    if dtype == np.float32:
        return "f32"
    if dtype == np.float16:
        return "f16"
    raise ValueError(f"image kernels write float32 or float16, not {dtype}")


def _image_out(images: DeviceArray, out: DeviceArray, layout: Layout) -> tuple[int, int, list[Arg]]:
    if images.dtype != np.uint8 or len(images.shape) != 4 or images.shape[3] != 3:
        raise ValueError(f"images must be uint8 [N, H, W, 3], got {images.dtype} {images.shape}")
    n = images.shape[0]
    if layout == "nchw":
        if len(out.shape) != 4 or out.shape[:2] != (n, 3):
            raise ValueError(f"out must be [{n}, 3, H, W], got {out.shape}")
        h, w = out.shape[2], out.shape[3]
        strides = (3 * h * w, h * w, w, 1)
    else:
        if len(out.shape) != 4 or out.shape[0] != n or out.shape[3] != 3:
            raise ValueError(f"out must be [{n}, H, W, 3], got {out.shape}")
        h, w = out.shape[1], out.shape[2]
        strides = (h * w * 3, 1, w * 3, 3)
    if n > GRID_Y_MAX or h > GRID_Y_MAX:
        raise ValueError(f"at most {GRID_Y_MAX} images and output rows per launch")
    return h, w, [pointer(out.ptr), *(i64(s) for s in strides)]


def resize_normalize(
    k: DeviceKernels,
    stream: int,
    images: DeviceArray,
    out: DeviceArray,
    norm: Normalisation,
    layout: Layout = "nchw",
) -> None:
    """preprocess.cu on `stream`: images uint8 [N, H, W, 3] -> out (float32/16)."""
    h, w, out_args = _image_out(images, out, layout)
    n, src_h, src_w, _ = images.shape
    args = [
        pointer(images.ptr), i32(src_h), i32(src_w), i64(src_w * 3), i64(src_h * src_w * 3),
        i32(h), i32(w), f32(resize_scale(src_w, w)), f32(resize_scale(src_h, h)),
        _normalise(norm), *out_args,
    ]  # fmt: skip
    grid = (-(-w // IMAGE_BLOCK_X), h, n)
    k.launch(f"resize_normalize_{_suffix(out.dtype)}", grid, (IMAGE_BLOCK_X, 1, 1), args, stream)


def letterbox(
    k: DeviceKernels,
    stream: int,
    images: DeviceArray,
    out: DeviceArray,
    norm: Normalisation,
    geometry: LetterboxGeometry,
    pad_value: float,
    layout: Layout = "nchw",
) -> None:
    """letterbox.cu on `stream`, with the geometry from image.letterbox_geometry."""
    h, w, out_args = _image_out(images, out, layout)
    n, src_h, src_w, _ = images.shape
    g = geometry
    args = [
        pointer(images.ptr), i32(src_h), i32(src_w), i64(src_w * 3), i64(src_h * src_w * 3),
        i32(h), i32(w), i32(g.new_h), i32(g.new_w), i32(g.off_y), i32(g.off_x),
        f32(g.scale_x), f32(g.scale_y), f32(pad_value), _normalise(norm), *out_args,
    ]  # fmt: skip
    grid = (-(-w // IMAGE_BLOCK_X), h, n)
    k.launch(f"letterbox_{_suffix(out.dtype)}", grid, (IMAGE_BLOCK_X, 1, 1), args, stream)


def softmax_topk(
    k: DeviceKernels,
    stream: int,
    logits: DeviceArray,
    top: int,
    apply_softmax: bool,
    out_index: DeviceArray,
    out_value: DeviceArray,
) -> None:
    """softmax_topk.cu on `stream`: logits [rows, cols] -> int32 and float32 [rows, top]."""
    if len(logits.shape) != 2:
        raise ValueError(f"logits must be [rows, classes], got {logits.shape}")
    rows, cols = logits.shape
    if not 1 <= top <= cols:
        raise ValueError(f"k must be between 1 and the number of classes ({cols}), got {top}")
    if out_index.dtype != np.int32 or out_value.dtype != np.float32:
        raise ValueError("top-k outputs are int32 indices and float32 values")
    if out_index.shape != (rows, top) or out_value.shape != (rows, top):
        raise ValueError(f"top-k outputs must be [{rows}, {top}]")
    cache_row = cols * 4 <= TOPK_MAX_CACHED_BYTES
    args = [
        pointer(logits.ptr), i32(rows), i32(cols), i32(top), i32(int(apply_softmax)),
        i32(int(cache_row)), pointer(out_index.ptr), pointer(out_value.ptr),
    ]  # fmt: skip
    k.launch(
        f"softmax_topk_{_suffix(logits.dtype)}", (rows, 1, 1), (TOPK_THREADS, 1, 1), args,
        stream, shared_bytes=cols * 4 if cache_row else 0,
    )  # fmt: skip


def nms(
    k: DeviceKernels,
    stream: int,
    boxes: DeviceArray,
    scores: DeviceArray,
    s: NmsSettings,
    out_boxes: DeviceArray,
    out_scores: DeviceArray,
    out_classes: DeviceArray,
    out_count: DeviceArray,
) -> None:
    """nms.cu on `stream`, one block per image."""
    if len(boxes.shape) != 3 or boxes.shape[2] != 4 or boxes.dtype != np.float32:
        raise ValueError(f"boxes must be float32 [N, B, 4], got {boxes.dtype} {boxes.shape}")
    if len(scores.shape) != 3 or scores.shape[:2] != boxes.shape[:2] or scores.dtype != np.float32:
        raise ValueError(f"scores must be float32 [N, B, C] with boxes {boxes.shape}")
    n, num_boxes, classes = scores.shape
    if num_boxes * classes >= 2**32 - 1:
        raise ValueError("NMS takes fewer than 2^32 - 1 (box, class) pairs per image")
    d = s.max_detections
    expect = [
        (out_boxes, (n, d, 4)),
        (out_scores, (n, d)),
        (out_classes, (n, d)),
        (out_count, (n,)),
    ]
    for array, shape in expect:
        if array.shape != shape:
            raise ValueError(f"NMS output of shape {array.shape} should be {shape}")
    args = [
        pointer(boxes.ptr), pointer(scores.ptr), i32(num_boxes), i32(classes),
        i32(1 if s.box_format == "cxcywh" else 0), f32(s.score_threshold), f32(s.iou_threshold),
        i32(min(s.max_candidates, MAX_CANDIDATES)), i32(d), f32(s.box_offset[0]),
        f32(s.box_offset[1]), f32(s.box_scale[0]), f32(s.box_scale[1]), pointer(out_boxes.ptr),
        pointer(out_scores.ptr), pointer(out_classes.ptr), pointer(out_count.ptr),
    ]  # fmt: skip
    k.launch("nms_per_class", (n, 1, 1), (NMS_THREADS, 1, 1), args, stream)


def _vector_bytes(row_bytes: int, *ptrs: int) -> int:
    for width in (16, 8, 4, 2, 1):
        if row_bytes % width == 0 and all(p % width == 0 for p in ptrs):
            return width
    return 1


def _kv_check(
    pool: DeviceArray, tables: DeviceArray, other: DeviceArray, per_seq: list[DeviceArray]
) -> None:
    if len(pool.shape) != 4 or len(other.shape) != 4 or other.dtype != pool.dtype:
        raise ValueError(
            f"pool and tensor must be 4-d of one dtype, got {pool.shape}, {other.shape}"
        )
    batch = tables.shape[0]
    if tables.dtype != np.int32 or len(tables.shape) != 2:
        raise ValueError(f"block_tables must be int32 [B, max_blocks], got {tables.shape}")
    if (
        other.shape[0] != batch
        or other.shape[1] != pool.shape[1]
        or other.shape[3] != pool.shape[3]
    ):
        raise ValueError(f"tensor {other.shape} does not match pool {pool.shape} and batch {batch}")
    for array in per_seq:
        if array.dtype != np.int32 or array.shape != (batch,):
            raise ValueError(f"per-sequence arrays must be int32 [{batch}], got {array.shape}")


def _kv_launch(
    k: DeviceKernels,
    stream: int,
    op: str,
    pool: DeviceArray,
    tensor: DeviceArray,
    head: list[Arg],
    tables: DeviceArray,
) -> None:
    nb, h, bs, d = pool.shape
    batch, _, length, _ = tensor.shape
    width = _vector_bytes(d * pool.dtype.itemsize, pool.ptr, tensor.ptr)
    vpr = d * pool.dtype.itemsize // width
    if length * vpr >= 2**30:
        raise ValueError("a (sequence, head) row of the tensor is too long for one launch")
    grid = (-(-(length * vpr) // KV_THREADS), min(batch * h, GRID_Y_MAX), 1)
    args = [
        *head,
        i32(batch),
        i32(h),
        i32(length),
        i32(vpr),
        i32(bs),
        i32(tables.shape[1]),
        i32(nb),
    ]
    k.launch(f"kv_{op}_v{width}", grid, (KV_THREADS, 1, 1), args, stream)


def kv_gather(
    k: DeviceKernels,
    stream: int,
    pool: DeviceArray,
    block_tables: DeviceArray,
    seq_lens: DeviceArray,
    out: DeviceArray,
) -> None:
    """kv_cache.cu gather: the twin's kv_gather(pool, block_tables, seq_lens, out)."""
    _kv_check(pool, block_tables, out, [seq_lens])
    head = [pointer(pool.ptr), pointer(block_tables.ptr), pointer(seq_lens.ptr), pointer(out.ptr)]
    _kv_launch(k, stream, "gather", pool, out, head, block_tables)


def kv_scatter(
    k: DeviceKernels,
    stream: int,
    new: DeviceArray,
    block_tables: DeviceArray,
    start_pos: DeviceArray,
    num_new: DeviceArray,
    pool: DeviceArray,
) -> None:
    """kv_cache.cu scatter: the twin's kv_scatter(new, block_tables, start_pos, num_new, pool)."""
    _kv_check(pool, block_tables, new, [start_pos, num_new])
    head = [
        pointer(new.ptr), pointer(block_tables.ptr), pointer(start_pos.ptr),
        pointer(num_new.ptr), pointer(pool.ptr),
    ]  # fmt: skip
    _kv_launch(k, stream, "scatter", pool, new, head, block_tables)
