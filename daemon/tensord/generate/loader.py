"""Loading a generator version: its directory, backend session, engine and warm-up."""

from __future__ import annotations

from pathlib import Path

from tensord.backends.base import BackendPlacement, DeviceOptions, TensorSpec
from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.errors import ModelLoadError
from tensord.generate.engine import GenerationEngine
from tensord.generate.model_dir import load_generator_dir
from tensord.generate.model_runner import StepItem
from tensord.registry.generator_config import GeneratorConfig
from tensord.registry.model_config import ModelConfig


def load_engine(
    name: str, model_path: Path, config: ModelConfig, where: DeviceOptions
) -> tuple[GenerationEngine, BackendPlacement, list[TensorSpec], list[TensorSpec]]:
    """Read the directory beside `model_path`, open the session, size the KV pool and
    start the engine (warmed up with a prefill and a decode step when config.warmup)."""
    directory = load_generator_dir(model_path.parent, config.model_file)
    spec = directory.spec
    limits = (config.generator or GeneratorConfig()).resolve(
        context_length=spec.context_length, kv_bytes_per_token=spec.kv_bytes_per_token
    )
    session_config = config.model_copy(update={"intra_op_threads": limits.intra_op_threads})
    backend = OnnxRuntimeBackend(spec.model_path, session_config, where)
    engine = GenerationEngine(name, directory, limits, backend.run)
    if config.warmup:
        try:
            _warm_up(engine)
        except Exception as exc:
            engine.close()
            raise ModelLoadError(f"warm-up generation step failed: {exc}") from None
    return engine, backend.placement, backend.inputs, backend.outputs


def _warm_up(engine: GenerationEngine) -> None:
    """A one-token prefill and a decode step on free blocks, so the first request pays
    no lazy set-up. The blocks stay free: a request writes its positions before reading.
    Two positions need two blocks when a block holds one token."""
    spec = engine.directory.spec
    token = spec.bos_token_id if spec.bos_token_id is not None else 0
    table = [0] if engine.storage.block_size > 1 else [0, 1]
    engine.runner.execute([StepItem("warm-up", [token], 0, table)])
    engine.runner.execute([StepItem("warm-up", [token], 1, table)])
    engine.runner.reset()
