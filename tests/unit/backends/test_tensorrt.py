"""The native TensorRT backend's host-side rules: optional, INT8 refusal, cache keys."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tensord.backends.tensorrt import check_int8, engine_key, tensorrt_status
from tensord.devices import probe_gpus
from tensord.errors import ModelLoadError
from tensord.modelconfig.model import ModelConfig, TensorRTConfig
from tensord.registry.registry import ModelRegistry
from tensord.registry.version import ModelState


def test_int8_needs_a_calibration_file(tmp_path: Path) -> None:
    assert check_int8(ModelConfig(), tmp_path) is None
    with pytest.raises(
        ModelLoadError, match=r"tensorrt\.int8 = true needs tensorrt\.calibration_file"
    ):
        check_int8(ModelConfig(tensorrt=TensorRTConfig(int8=True)), tmp_path)
    config = ModelConfig(tensorrt=TensorRTConfig(int8=True, calibration_file="calib.npy"))
    with pytest.raises(ModelLoadError, match=r"calib\.npy does not exist"):
        check_int8(config, tmp_path)
    (tmp_path / "calib.npy").write_bytes(b"")
    assert check_int8(config, tmp_path) == tmp_path / "calib.npy"


def test_engine_key_covers_model_version_gpu_and_flags() -> None:
    base = engine_key(b"model", "10.0", "H100", TensorRTConfig())
    assert len(base) == 32
    assert base == engine_key(b"model", "10.0", "H100", TensorRTConfig())
    others = {
        engine_key(b"other", "10.0", "H100", TensorRTConfig()),
        engine_key(b"model", "10.1", "H100", TensorRTConfig()),
        engine_key(b"model", "10.0", "H200", TensorRTConfig()),
        engine_key(b"model", "10.0", "H100", TensorRTConfig(fp16=True)),
        engine_key(b"model", "10.0", "H100", TensorRTConfig(max_batch=128)),
    }
    assert base not in others and len(others) == 5


def test_profile_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="min_batch <= opt_batch <= max_batch, got 1, 16, 8"):
        TensorRTConfig(opt_batch=16, max_batch=8)


def test_max_batch_size_must_fit_the_profile() -> None:
    with pytest.raises(ValueError, match=r"max_batch_size 128 exceeds tensorrt\.max_batch 64"):
        ModelConfig(backend="tensorrt", max_batch_size=128)
    ModelConfig(backend="tensorrt", max_batch_size=128, tensorrt=TensorRTConfig(max_batch=128))
    ModelConfig(max_batch_size=128)  # the profile is the native TensorRT backend's only


async def test_a_host_without_tensorrt_fails_that_model_only(
    tmp_path: Path, demo_repo: Path
) -> None:
    shutil.copytree(demo_repo / "mlp", tmp_path / "mlp")
    shutil.copytree(demo_repo / "mlp", tmp_path / "mlp_trt")
    (tmp_path / "mlp_trt" / "model.toml").write_text('backend = "tensorrt"\nmax_batch_size = 8\n')
    registry = ModelRegistry(tmp_path)
    await registry.load_all()
    states = {mv.name: (mv.state, mv.reason) for mv in registry.versions()}
    assert states["mlp"][0] is ModelState.READY
    state, reason = states["mlp_trt"]
    gpus = probe_gpus()
    available, why = tensorrt_status()
    if not gpus.gpus:
        assert state is ModelState.FAILED
        assert reason == f'backend = "tensorrt" needs a CUDA device: {gpus.unavailable_reason}'
    elif not available:
        assert state is ModelState.FAILED
        assert reason == f'backend = "tensorrt" cannot load: {why}'
    else:  # a GPU and TensorRT: the engine builds and serves
        assert state is ModelState.READY, reason
    await registry.close()


def test_engine_key_covers_the_calibration_data() -> None:
    config = TensorRTConfig(int8=True, calibration_file="calib.npy")
    first = engine_key(b"model", "10.0", "H100", config, b"samples one")
    assert first != engine_key(b"model", "10.0", "H100", config, b"samples two")
    assert first != engine_key(b"model", "10.0", "H100", config)


def test_calibration_samples_take_the_inputs_dtype_and_shape() -> None:
    import types

    import numpy as np

    from tensord.backends.tensorrt import _calibration_samples

    # TensorRT's own dtype mapping is trt.nptype; here its float32 answer stands in.
    trt = types.SimpleNamespace(nptype=lambda dtype: np.float32)
    tensor = types.SimpleNamespace(name="x", shape=(-1, 3, 4), dtype="float")
    samples = np.arange(8 * 12, dtype=np.float64).reshape(8, 3, 4)  # NumPy's default dtype
    out = _calibration_samples(trt, samples, tensor, batch=4)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == (8, 3, 4)
    assert np.array_equal(out, samples.astype(np.float32))
    with pytest.raises(ModelLoadError, match=r"samples of shape \[3, 5\], but input 'x'"):
        _calibration_samples(trt, np.zeros((8, 3, 5)), tensor, batch=4)
    with pytest.raises(ModelLoadError, match="holds 2 samples, fewer than one batch"):
        _calibration_samples(trt, np.zeros((2, 3, 4)), tensor, batch=4)
    with pytest.raises(ModelLoadError, match="holds <U1 values"):
        _calibration_samples(trt, np.full((8, 3, 4), "a"), tensor, batch=4)


def test_engine_key_covers_the_profiles() -> None:
    one = engine_key(b"model", "10.0", "H100", TensorRTConfig())
    assert one == engine_key(b"model", "10.0", "H100", TensorRTConfig(), profiles=1)
    assert one != engine_key(b"model", "10.0", "H100", TensorRTConfig(), profiles=2)


def test_lanes_share_one_engine_with_a_profile_each() -> None:
    from tensord.backends.tensorrt import SharedEngines

    engines = SharedEngines()
    loads: list[int] = []

    def load() -> str:
        loads.append(1)
        return "engine"

    assert engines.acquire("k", load, 2) == ("engine", 0)
    assert engines.acquire("k", load, 2) == ("engine", 1)
    assert loads == [1]  # deserialised once
    with pytest.raises(RuntimeError, match="all 2 optimisation profiles of the engine are taken"):
        engines.acquire("k", load, 2)
    engines.release("k", 0)
    assert engines.acquire("k", load, 2) == ("engine", 0)  # a freed profile is taken again
    engines.release("k", 0)
    engines.release("k", 1)
    assert engines.acquire("k", load, 2) == ("engine", 0) and loads == [1, 1]  # loaded anew
