"""A real uint8 image through the daemon started as systemd starts it: the demo
classifier's [preprocess] and [postprocess] serve top-k classes for raw pixels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tensord.backends.onnxruntime import session_options
from tensord.kernels import Normalisation, resize_normalize, softmax_topk
from tensord.modelconfig.model import ModelConfig
from tensord_client import Client
from tests.e2e.conftest import Daemon, log_events

pytestmark = pytest.mark.e2e


def photo(h: int, w: int) -> np.ndarray:
    """A 'photo': sky gradient, a sun and ground, with sensor noise, as uint8 RGB HWC."""
    rng = np.random.default_rng(11)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    img[..., 2] = 255 - 120 * y / h
    img[..., 1] = 160 - 60 * y / h
    img[..., 0] = 80
    sun = (x - 0.7 * w) ** 2 + (y - 0.3 * h) ** 2 < (0.1 * min(h, w)) ** 2
    img[sun] = [255, 230, 90]
    img[y > 0.65 * h] = [70, 120, 40]
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def test_classifier_serves_top_k_for_a_photo(daemon: Daemon, demo_repo: Path) -> None:
    image = photo(120, 160)[None]
    with Client(daemon.target) as client:
        out = client.predict("classifier", {"image": image})
        info = {m.name: m for m in client.info().models}["classifier"]
    norm = Normalisation.from_mean_std((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))
    session = ort.InferenceSession(
        str(demo_repo / "classifier" / "1" / "model.onnx"),
        session_options(ModelConfig()),
        providers=["CPUExecutionProvider"],
    )
    (logits,) = session.run(None, {"pixels": resize_normalize(image, 32, 32, norm)})
    classes, scores = softmax_topk(logits, 3)
    if info.executor == "cuda":  # the model itself runs on the CUDA provider: other rounding
        assert out["classes"][:, 0].tolist() == classes[:, 0].tolist()
        np.testing.assert_allclose(out["scores"][:, 0], scores[:, 0], rtol=1e-3)
    else:
        assert out["classes"].tolist() == classes.tolist()
        assert out["scores"].tobytes() == scores.tobytes()
    assert float(out["scores"].sum()) < 1.0 and (np.diff(out["scores"][0]) <= 0).all()
    expected_device = "cuda" if info.executor == "cuda" else "cpu"
    assert info.preprocess.device == info.postprocess.device == expected_device

    listed = subprocess.run(
        [sys.executable, "-m", "tensord_client.cli", "--target", daemon.target, "--json", "info"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    model = next(m for m in json.loads(listed.stdout)["models"] if m["name"] == "classifier")
    assert model["preprocess"]["kind"] == "resize" and model["postprocess"]["kind"] == "topk"
    events = log_events(daemon.log_path)
    loaded = next(e for e in events if e["event"] == "model.loaded" and e["model"] == "classifier")
    assert loaded["processing"] == [f"resize:{expected_device}", f"topk:{expected_device}"]
