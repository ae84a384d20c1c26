"""Each CUDA kernel against its NumPy twin on a real device: fresh random inputs (never
zeros), outputs poisoned before the launch so that an element left unwritten fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensord.kernels import classify, image, kv
from tensord.kernels.nms import NmsSettings
from tensord.kernels.nms import nms as nms_twin  # the package re-exports it over the module

pytestmark = pytest.mark.gpu

FLOAT_POISON = 0xFF  # float32/float16 NaN
INT_POISON = 0x7F  # int32 2139062143, never a valid index or count


class Device:
    """Device buffers on one stream, with uploads, poisoned outputs and downloads."""

    def __init__(self, cache: Path) -> None:
        from cuda.bindings import runtime as cudart

        from tensord.cuda.runtime import check
        from tensord.kernels.driver import load_kernels
        from tensord.kernels.sources import FAMILIES

        self.rt, self.check = cudart, check
        check(cudart.cudaSetDevice(0), "cudaSetDevice")
        self.stream = int(
            check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "stream")
        )
        self.kernels = load_kernels(0, cache, FAMILIES)
        self.ptrs: list[int] = []

    def _alloc(self, nbytes: int) -> int:
        ptr = int(self.check(self.rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        self.ptrs.append(ptr)
        return ptr

    def upload(self, array: np.ndarray) -> Any:
        from tensord.kernels.gpu import DeviceArray

        array = np.ascontiguousarray(array)
        ptr = self._alloc(array.nbytes)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.check(self.rt.cudaMemcpy(ptr, array.ctypes.data, array.nbytes, kind), "cudaMemcpy")
        self.check(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        return DeviceArray(ptr, array.shape, array.dtype)

    def poisoned(self, shape: tuple[int, ...], dtype: Any) -> Any:
        from tensord.kernels.gpu import DeviceArray

        dt = np.dtype(dtype)
        out = DeviceArray(self._alloc(int(np.prod(shape)) * dt.itemsize), tuple(shape), dt)
        byte = INT_POISON if dt.kind in "iu" else FLOAT_POISON
        self.check(self.rt.cudaMemset(out.ptr, byte, out.nbytes), "cudaMemset")
        self.check(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        return out

    def download(self, array: Any) -> np.ndarray:
        self.check(self.rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        host = np.empty(array.shape, dtype=array.dtype)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.check(
            self.rt.cudaMemcpy(host.ctypes.data, array.ptr, array.nbytes, kind), "cudaMemcpy"
        )
        return host

    def close(self) -> None:
        for ptr in self.ptrs:
            self.rt.cudaFree(ptr)
        self.rt.cudaStreamDestroy(self.stream)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    d = Device(tmp_path_factory.mktemp("kernel-cache"))
    yield d
    d.close()


def images(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    return rng.integers(1, 256, (n, h, w, 3), dtype=np.uint8)


NORM = image.Normalisation.from_mean_std((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))
SWAP = image.Normalisation.from_mean_std((10, 20, 30), (2, 3, 4), swap_rb=True)

IMAGE_CASES = [
    ((3, 37, 53), (32, 32), np.float32, "nchw", NORM),
    ((2, 480, 640), (224, 224), np.float16, "nchw", SWAP),
    ((1, 20, 30), (64, 48), np.float32, "nhwc", SWAP),
    ((4, 1, 1), (3, 5), np.float16, "nhwc", NORM),
    ((1, 1080, 1920), (640, 640), np.float32, "nchw", NORM),
]


def _out_shape(n: int, size: tuple[int, int], layout: str) -> tuple[int, ...]:
    return (n, 3, *size) if layout == "nchw" else (n, *size, 3)


@pytest.mark.parametrize(("src", "size", "dtype", "layout", "norm"), IMAGE_CASES)
def test_resize_normalize_matches_twin_bit_for_bit(
    dev: Device, src, size, dtype, layout, norm
) -> None:  # type: ignore[no-untyped-def]
    from tensord.kernels import gpu

    imgs = images(np.random.default_rng(sum(src)), *src)
    out = dev.poisoned(_out_shape(src[0], size, layout), dtype)
    gpu.resize_normalize(dev.kernels, dev.stream, dev.upload(imgs), out, norm, layout)
    expected = image.resize_normalize(imgs, *size, norm, dtype, layout)
    np.testing.assert_array_equal(dev.download(out), expected)


@pytest.mark.parametrize(("src", "size", "dtype", "layout", "norm"), IMAGE_CASES)
def test_letterbox_matches_twin_bit_for_bit(dev: Device, src, size, dtype, layout, norm) -> None:  # type: ignore[no-untyped-def]
    from tensord.kernels import gpu

    imgs = images(np.random.default_rng(sum(src) + 1), *src)
    out = dev.poisoned(_out_shape(src[0], size, layout), dtype)
    geo = image.letterbox_geometry(src[1], src[2], *size)
    gpu.letterbox(dev.kernels, dev.stream, dev.upload(imgs), out, norm, geo, 114.0, layout)
    expected, _ = image.letterbox(imgs, *size, norm, 114.0, dtype, layout)
    np.testing.assert_array_equal(dev.download(out), expected)


@pytest.mark.parametrize(
    ("rows", "cols", "k", "dtype", "softmax"),
    [
        (64, 1000, 5, np.float32, True),
        (7, 10, 10, np.float32, True),
        (33, 50_000, 8, np.float32, True),  # too long for the shared-memory row cache
        (16, 1000, 3, np.float16, True),
        (9, 300, 4, np.float32, False),
    ],
)
def test_softmax_topk_matches_twin(
    dev: Device, rows: int, cols: int, k: int, dtype, softmax: bool
) -> None:  # type: ignore[no-untyped-def]
    from tensord.kernels import gpu

    rng = np.random.default_rng(rows * cols)
    logits = rng.normal(0, 3, (rows, cols)).astype(dtype)
    logits[0, : cols // 2] = logits[0, cols // 2]  # ties break by index
    index = dev.poisoned((rows, k), np.int32)
    value = dev.poisoned((rows, k), np.float32)
    gpu.softmax_topk(dev.kernels, dev.stream, dev.upload(logits), k, softmax, index, value)
    want_index, want_value = classify.softmax_topk(logits, k, softmax)
    np.testing.assert_array_equal(dev.download(index), want_index)
    if softmax:
        # exp() and the order of the sum differ: float32 rounding, more over long rows.
        rtol = 1e-5 if cols <= 10_000 else 1e-4
        np.testing.assert_allclose(dev.download(value), want_value, rtol=rtol, atol=1e-7)
    else:
        np.testing.assert_array_equal(dev.download(value), want_value)


def detections(rng: np.random.Generator, n: int, b: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    xy = rng.uniform(0, 600, (n, b, 2)).astype(np.float32)
    wh = rng.uniform(4, 120, (n, b, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + wh], axis=2)
    scores = (rng.integers(1, 40, (n, b, c)) / 40).astype(np.float32)  # many exact ties
    return boxes, scores


@pytest.mark.parametrize(
    ("shape", "settings"),
    [
        ((2, 200, 3), NmsSettings(0.5, 0.45, 50, 1024)),
        ((3, 8400, 80), NmsSettings(0.25, 0.5, 300, 2048)),  # > 2048 candidates: merges
        ((1, 1000, 1), NmsSettings(0.1, 0.3, 2048, 2048, "cxcywh")),
        ((2, 500, 4), NmsSettings(0.2, 0.6, 100, 64, box_offset=(3, 17), box_scale=(0.75, 0.75))),
        ((2, 50, 2), NmsSettings(0.99, 0.5, 10)),  # no candidates
    ],
)
def test_nms_matches_twin_exactly(
    dev: Device, shape: tuple[int, int, int], settings: NmsSettings
) -> None:
    from tensord.kernels import gpu

    n, b, c = shape
    boxes, scores = detections(np.random.default_rng(b * c), n, b, c)
    d = settings.max_detections
    outs = [
        dev.poisoned((n, d, 4), np.float32),
        dev.poisoned((n, d), np.float32),
        dev.poisoned((n, d), np.int32),
        dev.poisoned((n,), np.int32),
    ]
    gpu.nms(dev.kernels, dev.stream, dev.upload(boxes), dev.upload(scores), settings, *outs)
    expected = nms_twin(boxes, scores, settings)
    for got, want in zip(outs, expected, strict=True):
        np.testing.assert_array_equal(dev.download(got), want)


def kv_case(rng: np.random.Generator, dtype: Any, d: int) -> dict[str, np.ndarray]:
    nb, h, bs, batch, max_blocks = 64, 4, 16, 5, 8

    def rand(shape: tuple[int, ...]) -> np.ndarray:
        if np.dtype(dtype).kind == "i":
            return rng.integers(1, 127, shape).astype(dtype)
        values = (rng.normal(size=shape) * 100).astype(dtype)
        values[values == 0] = 1
        return values

    pool = rand((nb, h, bs, d))
    tables = np.full((batch, max_blocks), -1, np.int32)
    ids = rng.permutation(nb)[: batch * max_blocks].reshape(batch, max_blocks)
    seq_lens = np.array([1, 100, 0, 37, 16], np.int32)
    num_new = np.array([3, 7, 1, 0, 16], np.int32)
    for i in range(batch):
        used = -(-int(seq_lens[i] + num_new[i]) // bs)
        tables[i, :used] = ids[i, :used]
    new = rand((batch, h, 16, d))
    return {"pool": pool, "tables": tables, "lens": seq_lens, "num_new": num_new, "new": new}


KV_TYPES = [
    (np.float32, 64),
    (np.float32, 6),
    (np.float32, 3),
    (np.float16, 128),
    (np.float16, 3),
    (np.int8, 5),
]


@pytest.mark.parametrize(("dtype", "d"), KV_TYPES)
def test_kv_gather_matches_twin(dev: Device, dtype: Any, d: int) -> None:
    from tensord.kernels import gpu

    case = kv_case(np.random.default_rng(d), dtype, d)
    batch, h = case["tables"].shape[0], case["pool"].shape[1]
    out = dev.poisoned((batch, h, 112, d), dtype)
    gpu.kv_gather(
        dev.kernels, dev.stream, dev.upload(case["pool"]), dev.upload(case["tables"]),
        dev.upload(case["lens"]), out,
    )  # fmt: skip
    expected = kv.kv_gather(
        case["pool"], case["tables"], case["lens"], np.empty((batch, h, 112, d), dtype)
    )
    assert dev.download(out).tobytes() == expected.tobytes()


@pytest.mark.parametrize(("dtype", "d"), KV_TYPES)
def test_kv_scatter_matches_twin(dev: Device, dtype: Any, d: int) -> None:
    from tensord.kernels import gpu

    case = kv_case(np.random.default_rng(d + 1), dtype, d)
    pool = dev.upload(case["pool"])
    gpu.kv_scatter(
        dev.kernels, dev.stream, dev.upload(case["new"]), dev.upload(case["tables"]),
        dev.upload(case["lens"]), dev.upload(case["num_new"]), pool,
    )  # fmt: skip
    expected = kv.kv_scatter(
        case["new"], case["tables"], case["lens"], case["num_new"], case["pool"].copy()
    )
    got = dev.download(pool)
    assert got.tobytes() == expected.tobytes()
    assert not np.array_equal(got, case["pool"])  # something was written


def test_launch_errors_are_checked(dev: Device) -> None:
    from tensord.kernels.driver import DriverError, i32

    with pytest.raises(DriverError, match="cuLaunchKernel nms_per_class failed"):
        dev.kernels.launch("nms_per_class", (1, 1, 1), (4096, 1, 1), [i32(0)] * 17, dev.stream)


@pytest.mark.ort_gpu
def test_processing_runs_kernels_on_the_cuda_executor(test_repo: Path) -> None:
    import onnxruntime as ort

    from tensord_client import Client
    from tests.conftest import start_server

    server = start_server(test_repo)
    try:
        with Client(server.target, timeout=30) as client:
            models = {m.name: m for m in client.info().models}
            for name in ("classifier", "detector"):
                assert models[name].executor == "cuda"
                assert models[name].preprocess.device == models[name].postprocess.device == "cuda"
            imgs = images(np.random.default_rng(4), 3, 48, 80)
            reply = client.predict("detector", {"image": imgs})
            norm = image.Normalisation.from_mean_std((0, 0, 0), (255, 255, 255))
            expected, info = image.letterbox(imgs, 64, 64, norm)
            assert reply["input_echo"].tobytes() == expected.tobytes()
            np.testing.assert_array_equal(reply["letterbox"], info)
            assert reply["num_detections"].tolist() == [4, 4, 4]
            assert reply["classes"].tolist() == [[0, 1, 0, 1, -1]] * 3
            top = client.predict("classifier", {"image": imgs})
            session = ort.InferenceSession(
                str(test_repo / "classifier" / "1" / "model.onnx"),
                providers=["CPUExecutionProvider"],
            )
            norm = image.Normalisation.from_mean_std(
                (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)
            )
            (logits,) = session.run(None, {"pixels": image.resize_normalize(imgs, 32, 32, norm)})
            classes, scores = classify.softmax_topk(logits, 3)
            # The model itself runs on the CUDA provider: its logits differ in rounding.
            assert top["classes"][:, 0].tolist() == classes[:, 0].tolist()
            np.testing.assert_allclose(top["scores"][:, 0], scores[:, 0], rtol=1e-3)
    finally:
        server.stop()
