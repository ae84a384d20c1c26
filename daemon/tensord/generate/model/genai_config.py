"""ONNX Runtime GenAI model-builder folders: what genai_config.json says about the decoder.

A builder folder (`python -m onnxruntime_genai.models.builder ...`, and the ONNX language
models published that way: Phi-3/3.5/4-mini-instruct-onnx, onnx-community's Llama 3.2 and
Qwen 2.5 builds) holds

  genai_config.json        model.decoder: file name, heads, KV heads, head size, layers,
                           input/output names, sliding windows; model: context length,
                           vocabulary, bos/eos/pad; search: sampling defaults
  model.onnx (+ .data)     one com.microsoft.GroupQueryAttention per layer, past and present
                           sharing one buffer, the row's length from the mask's count
  tokenizer.json, tokenizer_config.json (chat template), sometimes generation_config.json

and no config.json. `read_genai_config` turns it into the fields the rest of the loader
reads from a config.json (so one set of checks serves both layouts) plus what only the
slot path needs: the sliding-window layers and the providers the folder was built for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensord.errors import ModelLoadError
from tensord.generate.model.hf_config import JsonFile

GENAI_CONFIG_FILE = "genai_config.json"

_STANDARD_NAMES = {
    ("inputs", "input_ids"): "input_ids",
    ("inputs", "attention_mask"): "attention_mask",
    ("inputs", "position_ids"): "position_ids",
    ("inputs", "past_key_names"): "past_key_values.%d.key",
    ("inputs", "past_value_names"): "past_key_values.%d.value",
    ("outputs", "logits"): "logits",
    ("outputs", "present_key_names"): "present.%d.key",
    ("outputs", "present_value_names"): "present.%d.value",
}
"""The builder's default tensor names, the ones tensord feeds."""


@dataclass(slots=True, frozen=True)
class SlidingWindow:
    """decoder.sliding_window: layers whose cache holds only the last positions."""

    window_size: int
    layers: tuple[int, ...]
    cache_slack: int = 0


@dataclass(slots=True, frozen=True)
class GenaiConfig:
    """genai_config.json, read and checked."""

    path: Path
    filename: str
    """The decoder's ONNX file (model.decoder.filename)."""
    config: JsonFile
    """The decoder's shape and token ids under config.json's names (num_attention_heads,
    max_position_embeddings, eos_token_id, ...), for the checks both layouts share."""
    search: JsonFile
    """The search section under generation_config.json's names (sampling defaults)."""
    sliding_window: SlidingWindow | None
    providers: tuple[str, ...]
    """Execution providers named in decoder.session_options.provider_options (e.g.
    "cuda", "dml"): the ones the folder was built for; empty for a CPU build."""


def _object(data: Any, path: Path, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: {where} must be a JSON object, got {data!r:.80}")
    return data


def _check_names(decoder: dict[str, Any], path: Path) -> None:
    """tensord feeds the builder's default names; a folder that renamed them is refused
    with the name it uses."""
    for (section, key), standard in _STANDARD_NAMES.items():
        names = decoder.get(section) or {}
        value = names.get(key, standard) if isinstance(names, dict) else standard
        if value != standard:
            raise ModelLoadError(
                f"{path}: model.decoder.{section}.{key} is {value!r}; tensord serves the "
                f"model builder's names ({standard!r})"
            )


def _sliding_window(decoder: dict[str, Any], path: Path) -> SlidingWindow | None:
    raw = decoder.get("sliding_window")
    if raw is None:
        return None
    window = JsonFile(path, _object(raw, path, "model.decoder.sliding_window"))
    size = window.int_or_none(("window_size",))
    layers = window.data.get("layers") or []
    if size is None or not layers:
        return None  # a window the builder did not apply to any layer
    if not isinstance(layers, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers
    ):
        raise ModelLoadError(
            f"{path}: model.decoder.sliding_window.layers must be a list of layer indices"
        )
    slack = window.int_or_none(("cache_slack",), minimum=0) or 0
    return SlidingWindow(size, tuple(sorted(set(layers))), slack)


def _providers(decoder: dict[str, Any], path: Path) -> tuple[str, ...]:
    """The providers decoder.session_options.provider_options names ([{"cuda": {...}}])."""
    session = _object(decoder.get("session_options") or {}, path, "model.decoder.session_options")
    options = session.get("provider_options") or []
    if not isinstance(options, list):
        raise ModelLoadError(
            f"{path}: model.decoder.session_options.provider_options must be a list, "
            f"got {options!r:.80}"
        )
    names: list[str] = []
    for entry in options:
        if isinstance(entry, dict):
            names.extend(str(name).lower() for name in entry)
    return tuple(names)


def _config_fields(model: dict[str, Any], decoder: dict[str, Any]) -> dict[str, Any]:
    """The decoder's shape and token ids under config.json's names."""
    fields = {
        "model_type": model.get("type"),
        "num_hidden_layers": decoder.get("num_hidden_layers"),
        "num_attention_heads": decoder.get("num_attention_heads"),
        "num_key_value_heads": decoder.get("num_key_value_heads"),
        "head_dim": decoder.get("head_size"),
        "hidden_size": decoder.get("hidden_size"),
        "vocab_size": model.get("vocab_size"),
        "max_position_embeddings": model.get("context_length"),
        "bos_token_id": model.get("bos_token_id"),
        "eos_token_id": model.get("eos_token_id"),
        "pad_token_id": model.get("pad_token_id"),
    }
    return {name: value for name, value in fields.items() if value is not None}


def read_genai_config(path: Path) -> GenaiConfig:
    """genai_config.json; ModelLoadError naming the field when it cannot be served."""
    data = JsonFile.read(path, required=True).data
    model = _object(data.get("model"), path, "model")
    decoder = _object(model.get("decoder"), path, "model.decoder")
    _check_names(decoder, path)
    filename = _filename(decoder)
    if filename is None:
        raise ModelLoadError(
            f"{path}: model.decoder.filename must be a file name, got {decoder.get('filename')!r}"
        )
    config = JsonFile(path, _config_fields(model, decoder))
    for name in ("num_hidden_layers", "num_attention_heads", "head_dim"):
        config.require_int((name,))
    search = data.get("search") or {}
    return GenaiConfig(
        path=path,
        filename=filename,
        config=config,
        search=JsonFile(path, _object(search, path, "search")),
        sliding_window=_sliding_window(decoder, path),
        providers=_providers(decoder, path),
    )


def builder_model_file(directory: Path) -> str | None:
    """The decoder file a builder folder names (model.decoder.filename), or None when
    `directory` holds no readable genai_config.json (the load reports why)."""
    path = directory / GENAI_CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return _filename(JsonFile.read(path).data["model"]["decoder"])
    except Exception:  # whatever the file holds, the load says why; a scan goes on
        return None


def _filename(decoder: dict[str, Any]) -> str | None:
    """model.decoder.filename (default model.onnx) when it is a plain file name."""
    filename = decoder.get("filename", "model.onnx")
    return filename if isinstance(filename, str) and filename and "/" not in filename else None
