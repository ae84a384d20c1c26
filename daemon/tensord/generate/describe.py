"""What `tensord inspect` says of a decoder export: can Generate serve it, and how.

It reads the directory as the loader does (model_dir.py) and, where that succeeds, runs
the batch layout check (layout_check.py) on a CPU session with a small KV pool: the same
verdict the daemon reaches at load, without starting it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from tensord.errors import ModelLoadError
from tensord.generate.batch_layout import choose_layout
from tensord.generate.kv_storage import KVShape, KVStorage
from tensord.generate.layout_check import check_layout
from tensord.generate.model_dir import is_generator_dir, load_generator_dir
from tensord.generate.model_runner import ModelRunner

_CHECK_BLOCKS = 16
_CHECK_BLOCK_SIZE = 4


def looks_like_decoder(path: Path, graph: onnx.GraphProto) -> bool:
    """A graph with past_key_values inputs, or a file in a generator directory."""
    has_past = any(value.name.startswith("past_key_values.") for value in graph.input)
    return has_past or is_generator_dir(path.parent, path.name)


def describe_generator(path: Path) -> dict[str, Any]:
    """{"servable": bool, "reason": ...} plus, when servable, the spec and batch layout."""
    try:
        directory = load_generator_dir(path.parent, path.name)
    except ModelLoadError as exc:
        return {"servable": False, "reason": str(exc)}
    spec = directory.spec
    report: dict[str, Any] = {
        "servable": True,
        "model_type": spec.model_type,
        "layers": spec.num_layers,
        "attention_heads": spec.num_attention_heads,
        "kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "context_length": spec.context_length,
        "kv_dtype": spec.kv_dtype.name.lower(),
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        "takes_position_ids": spec.has_position_ids,
        "eos_token_ids": list(spec.eos_token_ids),
        "notes": list(spec.notes),
    }
    try:
        choice = _checked_layout(directory.spec)
    except ModelLoadError as exc:
        report.update(servable=False, reason=str(exc))
        return report
    report.update(batch_layout=choice.layout.value, batch_layout_reason=choice.reason)
    return report


def _checked_layout(spec: Any) -> Any:
    from tensord.backends.onnxruntime import OnnxRuntimeBackend
    from tensord.registry.model_config import ModelConfig

    backend = OnnxRuntimeBackend(spec.model_path, ModelConfig())
    try:
        shape = KVShape(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.kv_dtype.numpy)
        storage = KVStorage(shape, _CHECK_BLOCKS, _CHECK_BLOCK_SIZE)
        choice = choose_layout(spec.model_type, spec.has_position_ids)
        runner = ModelRunner(
            backend.run,
            storage,
            spec.num_layers,
            spec.has_position_ids,
            pad_token_id=spec.pad_token_id or 0,
            layout=choice.layout,
        )
        half = spec.kv_dtype.numpy.itemsize < 4
        return check_layout(runner, choice, spec.vocab_size, half)
    finally:
        backend.close()
