"""NumPy twins of preprocess.cu and letterbox.cu: uint8 HWC images -> normalised tensors.

The resize is OpenCV's INTER_LINEAR with half-pixel centres. Every step below is the same
IEEE float32 operation, in the same order, as in kernels/image_common.cuh, so the CUDA
kernels compiled with --fmad=false give the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Layout = Literal["nchw", "nhwc"]
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)


@dataclass(slots=True, frozen=True)
class Normalisation:
    """Per model channel c: out = (pixel[source_channels[c]] - mean[c]) * inv_std[c]."""

    mean: tuple[float, float, float]
    inv_std: tuple[float, float, float]
    """float32(1) / float32(std), computed once on the host for both paths."""
    source_channels: tuple[int, int, int] = (0, 1, 2)

    @classmethod
    def from_mean_std(
        cls, mean: tuple[float, ...], std: tuple[float, ...], swap_rb: bool = False
    ) -> Normalisation:
        """Mean and std per model channel, in pixel units; swap_rb for RGB <-> BGR."""
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"mean and std need 3 values each, got {mean} and {std}")
        if any(not s > 0 for s in std):
            raise ValueError(f"std values must be > 0, got {std}")
        inv = tuple(float(_ONE / np.float32(s)) for s in std)
        m = tuple(float(np.float32(v)) for v in mean)
        return cls(
            (m[0], m[1], m[2]), (inv[0], inv[1], inv[2]), (2, 1, 0) if swap_rb else (0, 1, 2)
        )


@dataclass(slots=True, frozen=True)
class LetterboxGeometry:
    """Where the resized image sits in the output, and the scale it was resized by."""

    new_h: int
    new_w: int
    off_y: int
    off_x: int
    scale_y: float
    """float32(src_h) / float32(new_h): input pixels per output pixel."""
    scale_x: float

    def info(self, src_h: int, src_w: int) -> np.ndarray:
        """(scale_x, scale_y, offset_x, offset_y): model = source * scale + offset."""
        return np.array(
            [self.new_w / src_w, self.new_h / src_h, self.off_x, self.off_y], dtype=np.float32
        )


def resize_scale(src: int, dst: int) -> float:
    """Input pixels per output pixel along one axis, as the kernel receives it (float32)."""
    return float(np.float32(src) / np.float32(dst))


def letterbox_geometry(src_h: int, src_w: int, dst_h: int, dst_w: int) -> LetterboxGeometry:
    """Fit src into dst keeping the aspect ratio, centred (see kernels/letterbox.cu)."""
    r = min(dst_w / src_w, dst_h / src_h)
    new_w = min(dst_w, max(1, math.floor(src_w * r + 0.5)))
    new_h = min(dst_h, max(1, math.floor(src_h * r + 0.5)))
    return LetterboxGeometry(
        new_h,
        new_w,
        (dst_h - new_h) // 2,
        (dst_w - new_w) // 2,
        resize_scale(src_h, new_h),
        resize_scale(src_w, new_w),
    )


def _axis(out_size: int, in_size: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices i0, i1 and weights a of one axis (image_common.cuh: bilinear_axis)."""
    d = np.arange(out_size, dtype=np.float32)
    f = (d + _HALF) * np.float32(scale) - _HALF
    fl = np.floor(f)
    i = fl.astype(np.int64)
    a = f - fl
    low = i < 0
    i[low], a[low] = 0, 0
    high = i >= in_size - 1
    i[high], a[high] = in_size - 1, 0
    return i, np.minimum(i + 1, in_size - 1), a


def _resample(
    images: np.ndarray, out_h: int, out_w: int, scale_y: float, scale_x: float, norm: Normalisation
) -> np.ndarray:
    """float32 [N, 3, out_h, out_w]: the bilinear samples, normalised."""
    _, src_h, src_w, _ = images.shape
    y0, y1, ay = _axis(out_h, src_h, scale_y)
    x0, x1, ax = _axis(out_w, src_w, scale_x)
    wx0 = _ONE - ax
    wy0 = (_ONE - ay)[:, None]
    ay = ay[:, None]
    out = np.empty((images.shape[0], 3, out_h, out_w), dtype=np.float32)
    for c in range(3):
        plane = images[..., norm.source_channels[c]]
        r0 = plane[:, y0].astype(np.float32)
        r1 = plane[:, y1].astype(np.float32)
        top = r0[:, :, x0] * wx0 + r0[:, :, x1] * ax
        bottom = r1[:, :, x0] * wx0 + r1[:, :, x1] * ax
        v = top * wy0 + bottom * ay
        out[:, c] = (v - np.float32(norm.mean[c])) * np.float32(norm.inv_std[c])
    return out


def _finish(planar: np.ndarray, dtype: np.dtype, layout: Layout) -> np.ndarray:
    if layout == "nhwc":
        planar = planar.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(planar.astype(dtype, copy=False))


def check_images(images: np.ndarray) -> None:
    """uint8 [N, H, W, 3] with H, W >= 1, or ValueError saying what is wrong."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
        raise ValueError(
            f"images must be uint8 [N, H, W, 3] (HWC, 3 channels), got {images.dtype} "
            f"{list(images.shape)}"
        )
    if images.shape[1] < 1 or images.shape[2] < 1:
        raise ValueError(f"images must be at least 1x1 pixels, got {list(images.shape)}")


def resize_normalize(
    images: np.ndarray,
    out_h: int,
    out_w: int,
    norm: Normalisation,
    dtype: np.dtype | type = np.float32,
    layout: Layout = "nchw",
) -> np.ndarray:
    """uint8 [N, H, W, 3] -> bilinear resize to out_h x out_w -> normalise -> dtype."""
    check_images(images)
    _, src_h, src_w, _ = images.shape
    planar = _resample(
        images, out_h, out_w, resize_scale(src_h, out_h), resize_scale(src_w, out_w), norm
    )
    return _finish(planar, np.dtype(dtype), layout)


def letterbox(
    images: np.ndarray,
    out_h: int,
    out_w: int,
    norm: Normalisation,
    pad_value: float = 114.0,
    dtype: np.dtype | type = np.float32,
    layout: Layout = "nchw",
) -> tuple[np.ndarray, np.ndarray]:
    """Aspect-preserving resize into out_h x out_w, padded; returns the tensor and
    float32 [N, 4] (scale_x, scale_y, offset_x, offset_y) per image."""
    check_images(images)
    n, src_h, src_w, _ = images.shape
    geo = letterbox_geometry(src_h, src_w, out_h, out_w)
    planar = np.empty((n, 3, out_h, out_w), dtype=np.float32)
    pad = np.float32(pad_value)
    for c in range(3):
        planar[:, c] = (pad - np.float32(norm.mean[c])) * np.float32(norm.inv_std[c])
    region = _resample(images, geo.new_h, geo.new_w, geo.scale_y, geo.scale_x, norm)
    planar[:, :, geo.off_y : geo.off_y + geo.new_h, geo.off_x : geo.off_x + geo.new_w] = region
    info = np.tile(geo.info(src_h, src_w), (n, 1))
    return _finish(planar, np.dtype(dtype), layout), info
