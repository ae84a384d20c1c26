"""The image preprocessing twins against hand-computed cases and OpenCV's resize."""

from __future__ import annotations

import numpy as np
import pytest

from tensord.kernels.image import (
    Normalisation,
    letterbox,
    letterbox_geometry,
    resize_normalize,
)
from tests.tools import require_module

IDENTITY = Normalisation.from_mean_std((0, 0, 0), (1, 1, 1))


def gray(values: list[list[float]]) -> np.ndarray:
    """A 1-image batch whose three channels all hold `values`."""
    plane = np.array(values, dtype=np.uint8)
    return np.repeat(plane[None, :, :, None], 3, axis=3)


def test_upscale_2x2_to_4x4_by_hand() -> None:
    out = resize_normalize(gray([[0, 100], [200, 40]]), 4, 4, IDENTITY)
    expected = np.array(
        [
            [0, 25, 75, 100],
            [50, 58.75, 76.25, 85],
            [150, 126.25, 78.75, 55],
            [200, 160, 80, 40],
        ],
        dtype=np.float32,
    )
    assert out.shape == (1, 3, 4, 4) and out.dtype == np.float32
    for c in range(3):
        np.testing.assert_array_equal(out[0, c], expected)


def test_downscale_by_two_averages_blocks() -> None:
    img = gray([[0, 4, 8, 12], [4, 8, 12, 16], [100, 104, 0, 0], [104, 108, 0, 2]])
    out = resize_normalize(img, 2, 2, IDENTITY)
    np.testing.assert_array_equal(out[0, 0], [[4, 12], [104, 0.5]])


def test_same_size_is_the_image_normalised() -> None:
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    norm = Normalisation.from_mean_std((10, 20, 30), (2, 4, 5))
    out = resize_normalize(img, 5, 7, norm)
    expected = (img.astype(np.float64) - [10, 20, 30]) / [2, 4, 5]
    np.testing.assert_allclose(out, expected.transpose(0, 3, 1, 2), rtol=1e-6, atol=1e-6)


def test_channel_swap_layout_and_float16() -> None:
    rng = np.random.default_rng(2)
    img = rng.integers(0, 256, (3, 9, 6, 3), dtype=np.uint8)
    swapped = Normalisation.from_mean_std((1, 2, 3), (4, 5, 6), swap_rb=True)
    plain = Normalisation.from_mean_std((1, 2, 3), (4, 5, 6))
    out = resize_normalize(img, 4, 5, swapped)
    np.testing.assert_array_equal(out, resize_normalize(img[..., ::-1].copy(), 4, 5, plain))
    nhwc = resize_normalize(img, 4, 5, swapped, layout="nhwc")
    assert nhwc.shape == (3, 4, 5, 3) and nhwc.flags.c_contiguous
    np.testing.assert_array_equal(nhwc, out.transpose(0, 2, 3, 1))
    half = resize_normalize(img, 4, 5, swapped, dtype=np.float16)
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, out.astype(np.float16))


@pytest.mark.parametrize(
    ("h", "w", "oh", "ow"),
    [(37, 53, 32, 32), (20, 30, 64, 48), (480, 640, 224, 224), (1, 1, 3, 5), (99, 1, 7, 4)],
)
def test_resize_matches_opencv(h: int, w: int, oh: int, ow: int) -> None:
    cv2 = require_module("cv2")
    rng = np.random.default_rng(h * w)
    img = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
    out = resize_normalize(img, oh, ow, IDENTITY)
    for n in range(2):
        ref = cv2.resize(img[n].astype(np.float32), (ow, oh), interpolation=cv2.INTER_LINEAR)
        if ref.ndim == 2:
            ref = ref[..., None]
        # OpenCV computes source coordinates in double, the kernels in float32.
        np.testing.assert_allclose(out[n].transpose(1, 2, 0), ref, atol=0.02, rtol=0)


def test_letterbox_geometry_by_hand() -> None:
    g = letterbox_geometry(2, 4, 4, 4)
    assert (g.new_h, g.new_w, g.off_y, g.off_x, g.scale_y, g.scale_x) == (2, 4, 1, 0, 1.0, 1.0)
    g = letterbox_geometry(4, 2, 6, 6)
    assert (g.new_h, g.new_w, g.off_y, g.off_x) == (6, 3, 0, 1)
    assert g.scale_y == np.float32(4) / np.float32(6)
    np.testing.assert_array_equal(g.info(4, 2), np.array([1.5, 1.5, 1, 0], np.float32))
    g = letterbox_geometry(300, 400, 320, 320)
    assert (g.new_h, g.new_w, g.off_y, g.off_x) == (240, 320, 40, 0)


def test_letterbox_pads_and_places_by_hand() -> None:
    img = gray([[10, 20, 30, 40], [50, 60, 70, 80]])
    norm = Normalisation.from_mean_std((4, 4, 4), (2, 2, 2))
    out, info = letterbox(img, 4, 4, norm, pad_value=114)
    pad = (114 - 4) / 2
    expected = np.array([[pad] * 4, [3, 8, 13, 18], [23, 28, 33, 38], [pad] * 4], dtype=np.float32)
    for c in range(3):
        np.testing.assert_array_equal(out[0, c], expected)
    np.testing.assert_array_equal(info, [[1, 1, 0, 1]])


@pytest.mark.parametrize(
    ("h", "w", "oh", "ow"), [(300, 400, 320, 320), (50, 20, 64, 96), (7, 7, 9, 9)]
)
def test_letterbox_matches_opencv(h: int, w: int, oh: int, ow: int) -> None:
    cv2 = require_module("cv2")
    img = np.random.default_rng(h + w).integers(0, 256, (1, h, w, 3), dtype=np.uint8)
    out, info = letterbox(img, oh, ow, IDENTITY, pad_value=114, layout="nhwc")
    g = letterbox_geometry(h, w, oh, ow)
    canvas = np.full((oh, ow, 3), 114, dtype=np.float32)
    region = cv2.resize(
        img[0].astype(np.float32), (g.new_w, g.new_h), interpolation=cv2.INTER_LINEAR
    )
    canvas[g.off_y : g.off_y + g.new_h, g.off_x : g.off_x + g.new_w] = region
    np.testing.assert_allclose(out[0], canvas, atol=0.02, rtol=0)
    sx, sy, ox, oy = info[0]
    # A source corner maps to the region's corner: model = source * scale + offset.
    assert (w * sx + ox, h * sy + oy) == pytest.approx((g.off_x + g.new_w, g.off_y + g.new_h))


def test_bad_images_are_refused() -> None:
    with pytest.raises(ValueError, match=r"uint8 \[N, H, W, 3\]"):
        resize_normalize(np.zeros((1, 4, 4, 4), np.uint8), 2, 2, IDENTITY)
    with pytest.raises(ValueError, match="at least 1x1"):
        resize_normalize(np.zeros((1, 0, 4, 3), np.uint8), 2, 2, IDENTITY)
    with pytest.raises(ValueError, match="std values must be > 0"):
        Normalisation.from_mean_std((0, 0, 0), (1, 0, 1))
