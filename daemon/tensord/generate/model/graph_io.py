"""What a decoder's ONNX graph says about itself: inputs, outputs, KV layout, external data.

Read with `onnx.load(..., load_external_data=False)`: only the graph, never the weights, so
a multi-gigabyte export is inspected in milliseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from tensord.dtypes import DType
from tensord.errors import ModelLoadError

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")

KV_DTYPES: dict[int, DType] = {
    TensorProto.FLOAT: DType.FLOAT32,
    TensorProto.FLOAT16: DType.FLOAT16,
    TensorProto.BFLOAT16: DType.BFLOAT16,
}

Dim = int | str  # a fixed size, or the name of a dynamic one


def past_names(layer: int) -> tuple[str, str]:
    """The key and value input names of one layer's past."""
    return f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"


def present_names(layer: int) -> tuple[str, str]:
    """The key and value output names of one layer's present (past + new tokens)."""
    return f"present.{layer}.key", f"present.{layer}.value"


@dataclass(slots=True, frozen=True)
class TensorInfo:
    """One graph input or output: element type (TensorProto enum) and dimensions."""

    name: str
    elem_type: int
    dims: tuple[Dim, ...]


@dataclass(slots=True, frozen=True)
class DecoderGraph:
    """The parts of a decoder graph the engine depends on."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    num_layers: int
    kv_dtype: DType
    kv_heads: int | None
    """From the past inputs' dimension 1 when the export fixed it."""
    head_dim: int | None
    """From the past keys' dimension 3 when the export fixed it."""
    value_head_dim: int | None
    """From the past values' dimension 3 when the export fixed it (keys and values of
    different sizes, as in multi-head latent attention, cannot share the KV pool)."""
    vocab_size: int | None
    """From the logits' last dimension when the export fixed it."""
    external_data: tuple[Path, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


def _info(value: onnx.ValueInfoProto) -> TensorInfo:
    tensor = value.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim)
    return TensorInfo(value.name, tensor.elem_type, dims)


def _layers(path: Path, names: list[str], pattern: re.Pattern[str], what: str) -> int:
    """How many layers the names cover; every layer 0..n-1 needs its key and its value."""
    found: set[tuple[int, str]] = set()
    for name in names:
        match = pattern.match(name)
        if match:
            found.add((int(match.group(1)), match.group(2)))
    count = 1 + max((layer for layer, _ in found), default=-1)
    missing = [
        f"{what}.{layer}.{kind}"
        for layer in range(count)
        for kind in ("key", "value")
        if (layer, kind) not in found
    ]
    if missing:
        raise ModelLoadError(f"{path}: the graph has no {', '.join(missing[:4])}")
    return count


def _external_data(path: Path, model: onnx.ModelProto) -> tuple[Path, ...]:
    directory = path.parent.resolve()
    files: set[Path] = set()
    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        location = ExternalDataInfo(tensor).location
        file = (directory / location).resolve()
        if not file.is_relative_to(directory):
            raise ModelLoadError(
                f"{path}: initializer {tensor.name!r} points outside the model directory "
                f"({location!r})"
            )
        if not file.is_file():
            raise ModelLoadError(
                f"{path}: initializer {tensor.name!r} keeps its weights in {location!r}, "
                f"but {file} does not exist"
            )
        files.add(file)
    return tuple(sorted(files))


def _fixed(dim: Dim) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def _check_names(path: Path, inputs: dict[str, TensorInfo], outputs: dict[str, TensorInfo]) -> None:
    for name in (INPUT_IDS, ATTENTION_MASK):
        if name not in inputs:
            raise ModelLoadError(
                f"{path}: the graph has no input {name!r}; it has {sorted(inputs)} "
                "(export with Optimum's --task text-generation-with-past)"
            )
    if LOGITS not in outputs:
        raise ModelLoadError(f"{path}: the graph has no output 'logits'; it has {sorted(outputs)}")
    known = {INPUT_IDS, ATTENTION_MASK, POSITION_IDS}
    unknown = sorted(n for n in inputs if n not in known and not _PAST.match(n))
    if unknown:
        raise ModelLoadError(
            f"{path}: inputs {unknown} are not part of the text-generation-with-past layout "
            "(input_ids, attention_mask, position_ids, past_key_values.*); tensord cannot "
            "feed them"
        )


def read_decoder_graph(path: Path) -> DecoderGraph:
    """The decoder's signature, checked against Optimum's text-generation-with-past layout."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelLoadError(f"{path}: not a readable ONNX model: {exc}") from None
    inputs = {v.name: _info(v) for v in model.graph.input}
    init_names = {t.name for t in model.graph.initializer}
    inputs = {n: t for n, t in inputs.items() if n not in init_names}
    outputs = {v.name: _info(v) for v in model.graph.output}
    _check_names(path, inputs, outputs)
    layers = _layers(path, list(inputs), _PAST, "past_key_values")
    if layers == 0:
        raise ModelLoadError(
            f"{path}: the graph has no past_key_values inputs: it was exported without a KV "
            "cache (export with Optimum's --task text-generation-with-past)"
        )
    present_layers = _layers(path, list(outputs), _PRESENT, "present")
    if present_layers != layers:
        raise ModelLoadError(
            f"{path}: {layers} layers of past_key_values inputs but {present_layers} of "
            "present outputs"
        )
    past = [inputs[name] for i in range(layers) for name in past_names(i)]
    elem_types = {t.elem_type for t in past}
    if len(elem_types) != 1 or next(iter(elem_types)) not in KV_DTYPES:
        names = sorted(TensorProto.DataType.Name(e) for e in elem_types)
        raise ModelLoadError(
            f"{path}: past_key_values must share one float type (float32, float16, bfloat16); "
            f"found {names}"
        )
    for info in past:
        if len(info.dims) != 4:
            raise ModelLoadError(
                f"{path}: {info.name} has rank {len(info.dims)}; the layout is "
                "[batch, kv_heads, past_length, head_dim]"
            )
    first, first_value = past[0].dims, past[1].dims
    logits = outputs[LOGITS].dims
    return DecoderGraph(
        inputs=tuple(inputs.values()),
        outputs=tuple(outputs.values()),
        num_layers=layers,
        kv_dtype=KV_DTYPES[next(iter(elem_types))],
        kv_heads=_fixed(first[1]),
        head_dim=_fixed(first[3]),
        value_head_dim=_fixed(first_value[3]),
        vocab_size=_fixed(logits[-1]) if logits else None,
        external_data=_external_data(path, model),
    )
