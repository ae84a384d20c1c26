"""Loading a generator version: its directory, backend session, engine and warm-up.

A model-builder folder (genai_config.json; fused GroupQueryAttention) is served on KV
slots. An Optimum export is too, once its attention is rewritten onto
GroupQueryAttention (attention_rewrite.py) and the result matches the export's own
logits; where the rewrite declines or disagrees, or model.toml sizes the paged pool, it
serves on the paged pool, with its batch layout checked at load (kv_paths.py says what
each path does, and Info and the log say which path a model got and why)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import structlog

from tensord.backends.base import BackendPlacement, DeviceOptions, TensorSpec
from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.errors import DeviceLostError, ModelLoadError
from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.engine.engine import GenerationEngine
from tensord.generate.engine.kv_paths import paged_kv_path, slot_kv_path
from tensord.generate.model.attention_rewrite import RewriteDeclined
from tensord.generate.model.model_dir import GeneratorDirectory, load_generator_dir
from tensord.generate.model.prefix_check import prefix_reuse
from tensord.generate.model.serving_graph import open_serving_graph
from tensord.generate.model.slot_graph import (
    REWRITE_REASON,
    check_runner,
    open_export_slots,
    open_slot_session,
    slot_layout,
    slot_runner,
)
from tensord.generate.worker.model_runner import PassStats
from tensord.modelconfig.generator import MIN_EXPORT_SLOTS, GeneratorConfig
from tensord.modelconfig.model import ModelConfig

log = structlog.get_logger("tensord.generate")


def load_engine(
    name: str, model_path: Path, config: ModelConfig, where: DeviceOptions
) -> tuple[GenerationEngine, BackendPlacement, list[TensorSpec], list[TensorSpec]]:
    """Read the directory beside `model_path`, open the session, size the KV cache and
    start the engine (warmed up with a prefill and a decode step when config.warmup)."""
    directory = load_generator_dir(model_path.parent, config.model_file)
    for note in directory.spec.notes:
        log.warning("generator.config_note", model=name, note=note)
    if directory.spec.genai is not None:
        engine, backend = _slot_engine(name, directory, config, where)
    else:
        engine, backend = _export_engine(name, directory, config, where)
    if config.warmup:
        try:
            _warm_up(engine)
        except Exception as exc:
            engine.close()
            backend.close()
            raise ModelLoadError(f"warm-up generation step failed: {exc}") from None
    log.info(
        "generator.kv_path",
        model=name,
        kv_path=engine.kv.name,
        batch_layout=engine.layout.layout.value,
        reason=engine.layout.reason,
        slots=engine.limits.num_blocks if engine.kv.slots is not None else None,
        kv_bytes=engine.kv.nbytes,
    )
    return engine, backend.placement, backend.inputs, backend.outputs


PAGED_KEYS = ("num_blocks", "block_size")

"""[generator] keys that size the paged pool: set, they keep an export on it."""


def _export_engine(
    name: str, directory: GeneratorDirectory, config: ModelConfig, where: DeviceOptions
) -> tuple[GenerationEngine, OnnxRuntimeBackend]:
    """An Optimum export on KV slots where its attention rewrites and checks, else on the
    paged pool with the reason."""
    generator = config.generator or GeneratorConfig()
    configured = [k for k in PAGED_KEYS if k in generator.model_fields_set]
    if generator.batch_layout not in ("auto", "padded"):
        configured.append("batch_layout")
    if configured:
        why = f"model.toml sets [generator] {', '.join(configured)}, which the paged pool takes"
    else:
        try:
            return _slot_engine(name, directory, config, where, rewrite=True)
        except DeviceLostError:
            raise
        except (RewriteDeclined, ModelLoadError) as exc:
            why = str(exc)
        except Exception as exc:  # a run or a graph the slots could not take: paged
            log.warning("generator.slots_failed", model=name, error=repr(exc))
            why = f"{type(exc).__name__}: {exc}"
    log.info("generator.not_on_slots", model=name, reason=why)
    return _paged_engine(name, directory, config, where, why)


def _paged_engine(
    name: str,
    directory: GeneratorDirectory,
    config: ModelConfig,
    where: DeviceOptions,
    not_slots: str = "",
) -> tuple[GenerationEngine, OnnxRuntimeBackend]:
    spec = directory.spec
    limits = (config.generator or GeneratorConfig()).resolve(
        context_length=spec.context_length, kv_bytes_per_token=spec.kv_bytes_per_token
    )
    session_config = config.model_copy(update={"intra_op_threads": limits.intra_op_threads})
    serving = open_serving_graph(spec, session_config, where, limits.layout)
    kv = paged_kv_path(spec, limits, serving.backend.run, serving.layout, serving.position_ids)
    if not_slots:
        kv.reason = f"{kv.reason}; not on KV slots: {not_slots}"
    return GenerationEngine(name, directory, limits, kv), serving.backend


def _slot_engine(
    name: str,
    directory: GeneratorDirectory,
    config: ModelConfig,
    where: DeviceOptions,
    rewrite: bool = False,
) -> tuple[GenerationEngine, OnnxRuntimeBackend]:
    """On KV slots: a builder folder's graph as it is, or (`rewrite`) an Optimum export's
    rewritten onto GroupQueryAttention and checked against the export's own logits."""
    spec = directory.spec
    generator = config.generator or GeneratorConfig()
    session_config = config.model_copy(update={"intra_op_threads": generator.intra_op_threads})
    reference: list[tuple[list[int], np.ndarray]] = []
    if rewrite:  # RewriteDeclined or ModelLoadError: the caller serves it paged
        bound = generator.max_model_len or spec.context_length or 64
        opened = open_export_slots(spec, session_config, where, bound)
        session, reference = opened.session, opened.reference
    else:
        session = open_slot_session(spec, session_config, where)
    prefix = None
    try:
        limits = generator.resolve_slots(
            context_length=spec.context_length,
            slot_bytes=lambda length: slot_layout(spec, length, session.device).slot_bytes,
            budget_bytes=session.kv_budget_bytes,
        )
        few = min(MIN_EXPORT_SLOTS, generator.max_num_seqs)
        if rewrite and limits.num_blocks < few:
            raise RewriteDeclined(
                f"only {limits.num_blocks} KV slot(s) of max_model_len {limits.max_model_len} "
                f"fit the KV budget, fewer than {few}; the paged pool shares it among "
                "sequences by their lengths (raise kv_cache_bytes, or lower max_model_len, "
                "for slots)"
            )
        runner = slot_runner(
            session,
            spec,
            limits.max_model_len,
            limits.num_blocks,
            limits.max_num_batched_tokens,
            position_ids=True if rewrite else None,
        )
        check_runner(runner, spec, limits.max_model_len, reference)
        prefix = prefix_reuse(
            runner, spec, limits.max_model_len, generator.prefix_cache_bytes, rewrite
        )
        kv = slot_kv_path(
            runner, limits.max_model_len, REWRITE_REASON if rewrite else "", prefix.reuse
        )
        if prefix.reason:
            kv.reason += f"; prefixes not reused: {prefix.reason}"
            log.info("generator.no_prefix_reuse", model=name, reason=prefix.reason)
        engine = GenerationEngine(name, directory, limits, kv)
    except BaseException:
        if prefix is not None and prefix.reuse is not None:
            prefix.reuse.store.close()
        session.backend.close()
        raise
    return engine, session.backend


def _warm_up(engine: GenerationEngine) -> None:
    """A one-token prefill and a decode step on free KV space of the engine's own, so the
    first request pays no lazy set-up. Nothing is kept: a request writes its positions
    before reading them. Two positions need two blocks when a block holds one token."""
    spec = engine.directory.spec
    token = spec.bos_token_id if spec.bos_token_id is not None else 0
    table = [0] if engine.limits.block_size > 1 else [0, 1]
    engine.runner.execute([ScheduledRequest("warm-up", [token], 0, table)])
    engine.runner.execute([ScheduledRequest("warm-up", [token], 1, table)])
    engine.runner.reset()
    engine.runner.stats = PassStats()
