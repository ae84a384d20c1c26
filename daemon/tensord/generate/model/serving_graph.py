"""The session a generator serves with, and its batch layout, decided and checked at load.

  1. choose_layout from the graph's inputs (and model.toml's batch_layout, which may only
     narrow it);
  2. a graph that counts positions from its past's length gets a position_ids input for
     its rotary embedding (graph_rewrite.py), and is checked on the padded layout; if the
     check disagrees, or the pattern is not there, the graph as exported serves with
     equal_length;
  3. check_layout on a small KV pool of its own (layout_check.py), which may narrow the
     layout further, or refuse the model.

Used by the loader and by `tensord inspect`, so both reach the same verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import structlog

from tensord.backends.base import DeviceOptions
from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.errors import ModelLoadError
from tensord.generate.model.batch_layout import BatchLayout, LayoutChoice, choose_layout, restrict
from tensord.generate.model.graph_rewrite import add_position_ids
from tensord.generate.model.layout_check import check_layout
from tensord.generate.model.model_dir import GeneratorSpec
from tensord.generate.worker.kv_storage import HostKVStorage, KVShape
from tensord.generate.worker.model_runner import ModelRunner
from tensord.modelconfig.model import ModelConfig

log = structlog.get_logger("tensord.generate")

_CHECK_BLOCKS = 16
_CHECK_BLOCK_SIZE = 4
PAGED_REASON = (
    "the graph grows its past by Concat (an Optimum export): sequences keep their keys and "
    "values in a paged block pool, gathered into each pass"
)
REWRITTEN_REASON = (
    "the graph counts positions from the past's length; tensord feeds its rotary embedding "
    "a position_ids input added at load, so pasts of any length share a pass, right-aligned "
    "with masked padding"
)


@dataclass(slots=True)
class ServingGraph:
    """An open session, whether tensord feeds it position_ids, and its checked layout."""

    backend: OnnxRuntimeBackend
    position_ids: bool
    layout: LayoutChoice


def _check(
    backend: OnnxRuntimeBackend, spec: GeneratorSpec, position_ids: bool, choice: LayoutChoice
) -> LayoutChoice:
    """check_layout on a small pool of its own (the session's arenas warm up on the way)."""
    shape = KVShape(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.kv_dtype.numpy)
    runner = ModelRunner(
        backend.run,
        HostKVStorage(shape, _CHECK_BLOCKS, _CHECK_BLOCK_SIZE),
        spec.num_layers,
        position_ids,
        pad_token_id=spec.pad_token_id or 0,
        layout=choice.layout,
    )
    half = spec.kv_dtype.numpy.itemsize < 4
    return check_layout(runner, choice, spec.vocab_size, half)


def _rewritten(
    spec: GeneratorSpec, config: ModelConfig, where: DeviceOptions | None
) -> ServingGraph | None:
    """The graph with a position_ids input, when it has the pattern and passes the padded
    check; None otherwise (the reason is logged)."""
    try:
        graph = add_position_ids(onnx.load(str(spec.model_path), load_external_data=False))
    except Exception as exc:  # the loader reads the graph the same way and reports it
        log.info("generator.rewrite_skipped", model_path=str(spec.model_path), error=repr(exc))
        return None
    if graph is None:
        return None
    backend = OnnxRuntimeBackend(spec.model_path, config, where, model=graph.SerializeToString())
    try:
        choice = _check(backend, spec, True, LayoutChoice(BatchLayout.PADDED, REWRITTEN_REASON))
    except ModelLoadError as exc:
        choice = LayoutChoice(BatchLayout.SINGLE, str(exc))
    if choice.layout is BatchLayout.PADDED:
        return ServingGraph(backend, True, choice)
    backend.close()
    log.info("generator.rewrite_rejected", model_path=str(spec.model_path), reason=choice.reason)
    return None


def open_serving_graph(
    spec: GeneratorSpec,
    config: ModelConfig,
    where: DeviceOptions | None = None,
    configured: BatchLayout | None = None,
) -> ServingGraph:
    """The session and layout to serve `spec` with; ModelLoadError when none is correct."""
    base = choose_layout(spec.model_type, spec.has_position_ids)
    if base.layout is BatchLayout.EQUAL_LENGTH and configured in (None, BatchLayout.PADDED):
        serving = _rewritten(spec, config, where)
        if serving is not None:
            return serving
    try:
        choice = restrict(base, configured)
    except ValueError as exc:
        raise ModelLoadError(f"[generator] {exc}") from None
    backend = OnnxRuntimeBackend(spec.model_path, config, where)
    try:
        checked = _check(backend, spec, spec.has_position_ids, choice)
    except BaseException:
        backend.close()
        raise
    return ServingGraph(backend, spec.has_position_ids, checked)
