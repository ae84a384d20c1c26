"""Predict with [preprocess]/[postprocess]: raw uint8 images in, top-k classes or boxes
after NMS out, through a real server and real ONNX Runtime sessions."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from tensord.backends.onnxruntime import session_options
from tensord.kernels import Normalisation, letterbox, resize_normalize, softmax_topk
from tensord.modelconfig.model import ModelConfig
from tensord_client import Client
from tests.models import DETECTOR_BOXES
from tests.tools import require_module

MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)


def picture(n: int, h: int, w: int, seed: int) -> np.ndarray:
    """uint8 HWC images with structure: gradients, a bright block and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], -1)
    images = np.repeat(base[None], n, axis=0).astype(np.int64)
    images[:, h // 4 : h // 2, w // 3 : w // 2] = [250, 30, 30]
    images += rng.integers(-20, 21, images.shape)
    return np.clip(images, 0, 255).astype(np.uint8)


def run_model(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        str(path), session_options(ModelConfig()), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


@pytest.mark.parametrize("shape", [(1, 32, 32), (3, 48, 64), (2, 300, 200)])
def test_classifier_top_k_from_uint8_images(
    client: Client, test_repo: Path, shape: tuple[int, int, int]
) -> None:
    images = picture(*shape, seed=sum(shape))
    out = client.predict("classifier", {"image": images})
    assert set(out) == {"classes", "scores"}
    assert out["classes"].dtype == np.int32 and out["classes"].shape == (shape[0], 3)
    model = test_repo / "classifier" / "1" / "model.onnx"
    # The CPU path is the twins around ONNX Runtime: bit for bit.
    pixels = resize_normalize(images, 32, 32, Normalisation.from_mean_std(MEAN, STD))
    (logits,) = run_model(model, {"pixels": pixels})
    classes, scores = softmax_topk(logits, 3)
    assert out["classes"].tolist() == classes.tolist()
    assert out["scores"].tobytes() == scores.tobytes()
    # An independent expectation: OpenCV's resize, float64 softmax, a sort.
    cv2 = require_module("cv2")
    resized = np.stack(
        [
            cv2.resize(im.astype(np.float32), (32, 32), interpolation=cv2.INTER_LINEAR)
            for im in images
        ]
    )
    normalised = ((resized - np.float32(MEAN)) / np.float32(STD)).transpose(0, 3, 1, 2)
    (ref_logits,) = run_model(model, {"pixels": np.ascontiguousarray(normalised, np.float32)})
    x = ref_logits.astype(np.float64)
    probs = np.exp(x - x.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    order = np.argsort(-x, axis=1, kind="stable")[:, :3]
    assert out["classes"].tolist() == order.tolist()
    np.testing.assert_allclose(out["scores"], np.take_along_axis(probs, order, 1), rtol=1e-3)


def test_detector_boxes_after_nms(client: Client) -> None:
    images = picture(2, 32, 64, seed=7)
    reply = client.predict("detector", {"image": images})
    assert set(reply) == {"boxes", "scores", "classes", "num_detections", "letterbox", "input_echo"}
    # 32x64 into 64x64 keeps scale 1 and centres vertically: offset (0, 16).
    np.testing.assert_array_equal(reply["letterbox"], [[1, 1, 0, 16]] * 2)
    assert reply["num_detections"].tolist() == [4, 4]
    assert reply["classes"].tolist() == [[0, 1, 0, 1, -1]] * 2
    np.testing.assert_array_equal(
        reply["scores"], np.array([[0.9, 0.7, 0.3, 0.2, 0]] * 2, np.float32)
    )
    # Boxes come back in the request image's pixels: y - 16.
    kept = DETECTOR_BOXES[[0, 1, 2, 2]] - np.float32([0, 16, 0, 16])
    for i in range(2):
        np.testing.assert_array_equal(reply["boxes"][i, :4], kept)
        np.testing.assert_array_equal(reply["boxes"][i, 4], [0, 0, 0, 0])
    # The model saw the letterboxed, normalised image (a passthrough output shows it).
    expected, _ = letterbox(images, 64, 64, Normalisation.from_mean_std((0, 0, 0), (255,) * 3))
    assert reply["input_echo"].tobytes() == expected.tobytes()
    np.testing.assert_allclose(reply["input_echo"][:, :, :16], 114 / 255, rtol=1e-6)


def test_output_subsets(client: Client) -> None:
    images = picture(1, 40, 40, seed=1)
    only = client.predict("detector", {"image": images}, outputs=["num_detections"])
    assert list(only) == ["num_detections"] and only["num_detections"].tolist() == [4]
    box = client.predict("detector", {"image": images}, outputs=["letterbox"])
    np.testing.assert_array_equal(box["letterbox"], np.float32([[1.6, 1.6, 0, 0]]))


def test_batched_images_get_their_own_answers(client: Client) -> None:
    from concurrent.futures import ThreadPoolExecutor

    requests = [picture(1 + i % 3, 40 if i % 2 else 30, 50, seed=i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(lambda im: client.predict("classifier_batched", {"image": im}), requests)
        )
    for images, reply in zip(requests, replies, strict=True):
        alone = client.predict("classifier", {"image": images})
        assert reply["classes"].tolist() == alone["classes"].tolist()
        assert reply["scores"].tobytes() == alone["scores"].tobytes()
    info = {m.name: m for m in client.info().models}["classifier_batched"]
    assert info.dynamic_batching.requests == 8
    assert info.dynamic_batching.batches < 8, "no two images of one size were joined"


def test_info_says_where_processing_runs(client: Client) -> None:
    models = {m.name: m for m in client.info().models}
    classifier, detector = models["classifier"], models["detector"]
    assert [(s.name, s.dtype, list(s.shape)) for s in classifier.inputs] == [
        ("image", 2, [-1, -1, -1, 3])
    ]
    assert [s.name for s in classifier.outputs] == ["classes", "scores"]
    assert classifier.preprocess.kind == "resize" and classifier.preprocess.device == "cpu"
    assert "32x32" in classifier.preprocess.description
    assert "NumPy twins" in classifier.preprocess.reason
    assert classifier.postprocess.kind == "topk" and classifier.postprocess.device == "cpu"
    assert detector.preprocess.kind == "letterbox" and detector.postprocess.kind == "nms"
    assert [s.name for s in detector.outputs] == [
        "boxes", "scores", "classes", "num_detections", "letterbox", "input_echo",
    ]  # fmt: skip
    assert not models["mlp"].proto.HasField("preprocess")


@pytest.mark.parametrize(
    ("images", "message"),
    [
        (
            np.zeros((1, 8, 8, 4), np.uint8),
            "input 'image': dimension 3 is 4, but the model expects 3",
        ),
        (
            np.zeros((1, 8, 8, 3), np.float32),
            "input 'image': dtype DATA_TYPE_FLOAT32 does not match",
        ),
        (np.zeros((1, 1, 600, 3), np.uint8), "image size 1x600 is outside 1..512 pixels per side"),
        (np.zeros((1, 0, 5, 3), np.uint8), "image size 0x5 is outside 1..512"),
    ],
)
def test_bad_images_are_invalid_argument(client: Client, images: np.ndarray, message: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        client.predict("detector", {"image": images})
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()
    assert client.predict("detector", {"image": picture(1, 8, 8, 0)})[
        "num_detections"
    ].tolist() == [4]
