"""What `tensord inspect` says of a decoder export: can Generate serve it, and how.

It reads the directory as the loader does (model_dir.py) and, where that succeeds, opens
and checks the session as the loader does (slot_graph.py for KV slots, an Optimum
export's rewritten attention first; serving_graph.py for the paged pool), on the CPU:
the same verdict the daemon reaches at load, without starting it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from tensord.errors import ModelLoadError
from tensord.generate.model.attention_rewrite import RewriteDeclined, layer_windows_of
from tensord.generate.model.model_dir import GeneratorSpec, is_generator_dir, load_generator_dir
from tensord.generate.model.prefix_check import prefix_reuse, slot_windows
from tensord.generate.model.serving_graph import PAGED_REASON, open_serving_graph
from tensord.generate.model.slot_graph import (
    RAGGED_REASON,
    REWRITE_REASON,
    SLOTS_REASON,
    SlotSession,
    check_runner,
    check_slots,
    open_export_slots,
    open_slot_session,
    slot_layout,
    slot_runner,
)
from tensord.modelconfig.generator import (
    MIN_EXPORT_SLOTS,
    BatchLayout,
    GeneratorConfig,
    slot_max_model_len,
)
from tensord.modelconfig.model import ModelConfig


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
    if spec.genai is not None:
        return _describe_slots(spec, report)
    try:
        return _describe_export_slots(spec, report)
    except (RewriteDeclined, ModelLoadError) as exc:
        not_slots = str(exc)
    except Exception as exc:  # as the loader: a run the slots could not take, paged
        not_slots = f"{type(exc).__name__}: {exc}"
    try:
        serving = open_serving_graph(spec, ModelConfig())
    except ModelLoadError as exc:
        report.update(servable=False, reason=str(exc))
        return report
    serving.backend.close()
    report.update(
        kv_path="paged",
        kv_path_reason=f"{PAGED_REASON}; not on KV slots: {not_slots}",
        batch_layout=serving.layout.layout.value,
        batch_layout_reason=serving.layout.reason,
        feeds_position_ids=serving.position_ids,
    )
    return report


def _describe_export_slots(spec: GeneratorSpec, report: dict[str, Any]) -> dict[str, Any]:
    """An Optimum export rewritten onto GroupQueryAttention and checked as the loader
    does, on the CPU; RewriteDeclined or ModelLoadError when it stays paged."""
    length = slot_max_model_len(spec.context_length)
    generator = GeneratorConfig()
    limits = generator.resolve_slots(  # ModelLoadError when not even one slot fits
        context_length=spec.context_length,
        slot_bytes=lambda n: slot_layout(spec, n).slot_bytes,
        budget_bytes=None,
    )
    few = min(MIN_EXPORT_SLOTS, generator.max_num_seqs)
    if limits.num_blocks < few:
        raise RewriteDeclined(
            f"only {limits.num_blocks} KV slot(s) of max_model_len {length} fit the default "
            f"KV budget, fewer than {few}"
        )
    checked = min(length, 48)  # the checks' sequences: slots of their length only
    windows = layer_windows_of(spec)
    opened = open_export_slots(spec, ModelConfig(), None, checked)
    try:
        runner = slot_runner(opened.session, spec, checked, 3, position_ids=True)
        check_runner(runner, spec, checked, opened.reference)
        prefix = _prefix_report(opened.session, spec, length, rewritten=True)
    finally:
        opened.session.backend.close()
    report.update(
        layout="Optimum export, its attention rewritten onto GroupQueryAttention",
        built_for=["cpu", "cuda (float16)"],
        sliding_window=_windows_report(windows),
        kv_path="slots",
        kv_path_reason=REWRITE_REASON,
        batch_layout=BatchLayout.RAGGED.value,
        batch_layout_reason=RAGGED_REASON,
        slot_bytes_at_default_max_model_len=slot_layout(spec, length).slot_bytes,
        default_max_model_len=length,
        feeds_position_ids=True,
        **prefix,
    )
    return report


def _describe_slots(spec: GeneratorSpec, report: dict[str, Any]) -> dict[str, Any]:
    """A model-builder folder: its session opened and its slots checked as the loader
    does, on the CPU."""
    assert spec.genai is not None
    window = spec.genai.sliding_window
    report.update(
        layout="model-builder folder (genai_config.json)",
        built_for=list(spec.genai.providers) or ["cpu"],
        sliding_window=None
        if window is None
        else {"window_size": window.window_size, "layers": list(window.layers)},
    )
    try:
        session = open_slot_session(spec, ModelConfig())
    except ModelLoadError as exc:
        report.update(servable=False, reason=str(exc))
        return report
    length = slot_max_model_len(spec.context_length)
    layout = slot_layout(spec, length, session.device)
    # The check's sequences are short: slots of their length, not of max_model_len (a
    # real model's full slot takes gigabytes).
    checked = min(length, (window.window_size if window is not None else 0) + 16)
    try:
        check_slots(slot_runner(session, spec, checked, 3), spec, checked)
        prefix = _prefix_report(session, spec, length, rewritten=False)
    except ModelLoadError as exc:
        report.update(servable=False, reason=str(exc))
        return report
    finally:
        session.backend.close()
    report.update(
        kv_path="slots",
        kv_path_reason=SLOTS_REASON,
        batch_layout=BatchLayout.RAGGED.value,
        batch_layout_reason=RAGGED_REASON,
        slot_bytes_at_default_max_model_len=layout.slot_bytes,
        default_max_model_len=length,
        **prefix,
    )
    return report


def _prefix_report(
    session: SlotSession, spec: GeneratorSpec, length: int, rewritten: bool
) -> dict[str, Any]:
    """Whether prompt prefixes are reused, checked as the loader does (on slots of the
    check's length: a ring of a sliding window keeps its own length)."""
    windows = [w for w in slot_windows(spec, rewritten) if w is not None and w <= 512]
    checked = min(length, max(windows, default=0) + 64)
    runner = slot_runner(session, spec, checked, 2, position_ids=True if rewritten else None)
    verdict = prefix_reuse(runner, spec, checked, None, rewritten)
    if verdict.reuse is not None:
        verdict.reuse.store.close()
    return {
        "prefix_reuse": verdict.reuse is not None,
        "prefix_reuse_reason": verdict.reason
        or "a prompt over stored prefix blocks matched the same prompt computed whole",
    }


def _windows_report(windows: tuple[int | None, ...]) -> dict[str, Any] | None:
    """The sliding window as inspect prints it: its size and the layers that have it."""
    layers = [i for i, w in enumerate(windows) if w is not None]
    if not layers:
        return None
    return {"window_size": max(w for w in windows if w is not None), "layers": layers}
