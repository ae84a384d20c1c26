"""The daemon's GPU pre- and postprocessing on a real device without onnxruntime-gpu: the
served classifier and detector of the test repository on the CUDA executor, each lane's
model a CPU ONNX Runtime session behind device buffers (tests/gpu/host_model_backend.py),
with the preprocessing and postprocessing kernels on the lane's stream. What the daemon
answers must equal the NumPy twins around the same CPU model."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensord.kernels import classify, image

pytestmark = pytest.mark.gpu

CLASSIFIER_NORM = ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))


@pytest.fixture
def device_processing_server(test_repo: Path, tmp_path: Path) -> Iterator[tuple[Any, list[Any]]]:
    from tensord.config import load_config
    from tests.conftest import ServerThread
    from tests.gpu.host_model_backend import HostModelBackend

    for name in ("classifier", "detector"):
        shutil.copytree(test_repo / name, tmp_path / name)
    made: list[HostModelBackend] = []

    def factory(path: Path, config: Any, where: Any) -> HostModelBackend:
        made.append(HostModelBackend(path, config, where))
        return made[-1]

    overrides = {"model_repository": str(tmp_path), "server.listen": "127.0.0.1:0"}
    srv = ServerThread(load_config(None, env={}, overrides=overrides), backend_factory=factory)
    srv.start()
    yield srv, made
    srv.stop()


def test_device_processing_in_the_daemon_matches_the_twins(
    device_processing_server: tuple[Any, list[Any]],
) -> None:
    import onnxruntime as ort

    from tensord.v1 import inference_pb2 as pb
    from tensord_client import Client

    server, made = device_processing_server
    rng = np.random.default_rng(7)
    imgs = rng.integers(0, 256, (3, 48, 80, 3), dtype=np.uint8)
    with Client(server.target, timeout=60, retries=0) as client:
        models = {m.name: m for m in client.info().models}
        for name in ("classifier", "detector"):
            model = models[name]
            assert model.state == pb.MODEL_STATE_READY, model.reason
            assert model.executor == "cuda", model.executor_status.reason
            assert model.preprocess.device == model.postprocess.device == "cuda"
        runs_before = sum(backend.runs for backend in made)

        reply = client.predict("detector", {"image": imgs})
        norm = image.Normalisation.from_mean_std((0, 0, 0), (255, 255, 255))
        letterboxed, info = image.letterbox(imgs, 64, 64, norm)
        assert reply["input_echo"].tobytes() == letterboxed.tobytes()
        np.testing.assert_array_equal(reply["letterbox"], info)
        assert reply["num_detections"].tolist() == [4, 4, 4]
        assert reply["classes"].tolist() == [[0, 1, 0, 1, -1]] * 3

        top = client.predict("classifier", {"image": imgs})
        session = ort.InferenceSession(
            str(server.config.model_repository / "classifier" / "1" / "model.onnx"),
            providers=["CPUExecutionProvider"],
        )
        norm = image.Normalisation.from_mean_std(*CLASSIFIER_NORM)
        (logits,) = session.run(None, {"pixels": image.resize_normalize(imgs, 32, 32, norm)})
        classes, scores = classify.softmax_topk(logits, 3)
        np.testing.assert_array_equal(top["classes"], classes)
        np.testing.assert_allclose(top["scores"], scores, rtol=1e-5, atol=1e-7)

        assert sum(backend.runs for backend in made) >= runs_before + 2
        for name in ("classifier", "detector"):
            (model,) = [m for m in client.info().models if m.name == name]
            assert {p.name: p.in_use_bytes for p in model.executor_status.pools} == {
                "pinned": 0,
                "device": 0,
            }
    assert all(backend.pool.stats().in_use_bytes == 0 for backend in made)
