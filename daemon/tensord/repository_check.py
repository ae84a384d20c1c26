"""`tensord check-config`'s look at the model repository: each version's graph read with
`onnx` (never its weights, never an ONNX Runtime session) and checked as the loader would
check it, so that a broken model is found before the daemon starts.

What it can find: a missing or misplaced model file, a file that is not ONNX, a graph that
onnx.checker refuses (external weight files missing included), tensor types tensord cannot
carry, model.toml overrides, processing and batching settings that do not fit the graph,
and a generator directory that does not read. What only loading finds (an operator the
execution provider lacks, a warm-up run that fails) it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from tensord.backends.base import TensorSpec
from tensord.backends.onnx_file import read_onnx
from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.registry.layout import SkippedEntry
from tensord.registry.repository import VersionSource, read_repository

Dim = int | str
"""A fixed size, or the name of a dynamic dimension ("?" when it has none)."""

_DTYPES: dict[int, DType] = {
    TensorProto.BOOL: DType.BOOL,
    TensorProto.UINT8: DType.UINT8,
    TensorProto.INT8: DType.INT8,
    TensorProto.INT16: DType.INT16,
    TensorProto.INT32: DType.INT32,
    TensorProto.INT64: DType.INT64,
    TensorProto.FLOAT16: DType.FLOAT16,
    TensorProto.BFLOAT16: DType.BFLOAT16,
    TensorProto.FLOAT: DType.FLOAT32,
    TensorProto.DOUBLE: DType.FLOAT64,
    TensorProto.STRING: DType.STRING,
}


@dataclass(slots=True, frozen=True)
class TensorLine:
    """One input or output as a client sees it."""

    name: str
    dtype: str
    dims: tuple[Dim, ...] | None
    """None when the model gives it no shape, not even a rank."""


@dataclass(slots=True)
class VersionCheck:
    """One version: what it serves, or why it cannot be served."""

    version: int
    problem: str = ""
    """Why the version cannot be served; empty when it can."""
    inputs: list[TensorLine] = field(default_factory=list)
    outputs: list[TensorLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ModelCheck:
    """One model and each of its versions."""

    name: str
    kind: str
    versions: list[VersionCheck]

    @property
    def broken(self) -> bool:
        """A version cannot be served."""
        return any(v.problem for v in self.versions)


@dataclass(slots=True)
class RepositoryCheck:
    """The whole repository: its models and the entries that are none."""

    root: Path
    models: list[ModelCheck]
    skipped: list[SkippedEntry]


def check_repository(root: Path, follow_symlinks: bool = False) -> RepositoryCheck:
    """Scan `root` as the daemon does and check every version's files."""
    scan = read_repository(root, follow_symlinks)
    models: dict[str, ModelCheck] = {}
    for src in scan.sources:
        model = models.setdefault(src.name, ModelCheck(src.name, src.kind, []))
        model.versions.append(check_version(src))
    return RepositoryCheck(root, list(models.values()), scan.skipped)


def check_version(src: VersionSource) -> VersionCheck:
    """What one version would serve, or why it cannot be served."""
    found = VersionCheck(src.version)
    try:
        if src.error:
            raise ModelLoadError(src.error)
        if src.kind == "generator":
            _check_generator(src, found)
        elif src.kind == "embedding":
            _check_embedding(src, found)
        else:
            _check_predict(src, found)
    except ModelLoadError as exc:
        found.problem = str(exc)
    except Exception as exc:  # a check must report, never stop the others
        found.problem = f"{src.path}: unexpected error while checking: {exc!r}"
    if found.problem:
        found.inputs, found.outputs = [], []
    return found


def read_graph(path: Path) -> onnx.ModelProto:
    """The model without its weights, after onnx.checker (which also sees that external
    weight files exist); ModelLoadError saying why it is no usable ONNX model."""
    model = read_onnx(path)
    _check_external_data(path, model)
    try:
        onnx.checker.check_model(str(path))  # by path: it reads no weights, finds their files
    except Exception as exc:
        said = " ".join(str(exc).split()) or repr(exc)  # one line: it may span several
        raise ModelLoadError(f"{path}: onnx.checker refuses the model: {said}") from None
    return model


def _check_external_data(path: Path, model: onnx.ModelProto) -> None:
    """Every file the graph keeps weights in is there (onnx.checker says it less plainly)."""
    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            if not (path.parent / location).is_file():
                raise ModelLoadError(
                    f"{path}: initializer {tensor.name!r} keeps its weights in {location!r}, "
                    f"but {path.parent / location} does not exist"
                )


def _check_predict(src: VersionSource, found: VersionCheck) -> None:
    from tensord.backends.signature import apply_overrides, check_batching
    from tensord.processing.plan import plan_processing

    config = src.config
    graph = read_graph(src.path).graph
    names = {t.name for t in graph.initializer}
    model_in = [_spec(v, "input") for v in graph.input if v.name not in names]
    model_out = [_spec(v, "output") for v in graph.output]
    inputs = apply_overrides(model_in, config.inputs, "inputs")
    outputs = apply_overrides(model_out, config.outputs, "outputs")
    plan = plan_processing(config.preprocess, config.postprocess, inputs, outputs)
    if plan is not None:
        inputs, outputs = list(plan.served_inputs), list(plan.served_outputs)
    check_batching(config, [*inputs, *outputs])
    dims = {v.name: _graph_dims(v) for v in (*graph.input, *graph.output)}
    found.inputs = [_line(s, dims.get(s.name)) for s in inputs]
    found.outputs = [_line(s, dims.get(s.name)) for s in outputs]
    if config.backend == "tensorrt":
        found.notes.append("a native TensorRT engine is built from it at load (not checked here)")


def _check_embedding(src: VersionSource, found: VersionCheck) -> None:
    from tensord.embedding.folder import read_embedding_folder
    from tensord.registry.registry import embedding_signature

    read_graph(src.path)
    model_file = src.path.relative_to(src.directory).as_posix()
    spec = read_embedding_folder(src.directory, model_file, src.config.embedding)
    inputs, outputs = embedding_signature(spec.dimensions)
    found.inputs = [_line(s, None) for s in inputs]
    found.outputs = [_line(s, None) for s in outputs]
    found.notes.append(f"an embedding model: {spec.describe()}")


def _check_generator(src: VersionSource, found: VersionCheck) -> None:
    from tensord.generate.model.graph_io import read_decoder_graph
    from tensord.generate.model.model_dir import load_generator_dir

    read_graph(src.path)
    spec = load_generator_dir(src.directory, src.config.model_file).spec
    graph = read_decoder_graph(src.path)
    past = [t for t in graph.inputs if t.name.startswith("past_key_values.")]
    for kind, tensors in (("inputs", graph.inputs), ("outputs", graph.outputs)):
        lines = [
            TensorLine(
                t.name, _dtype_name(t.elem_type), tuple(d if d != "" else "?" for d in t.dims)
            )
            for t in tensors
            if not t.name.startswith(("past_key_values.", "present."))
        ]
        getattr(found, kind).extend(lines)
    kv = past[0].dims if past else ()
    found.notes.append(
        f"{spec.model_type or 'decoder'}: {spec.num_layers} layers, vocabulary "
        f"{spec.vocab_size}, context {spec.context_length or 'not declared'}; KV cache "
        f"{spec.kv_dtype.name.lower()} {_dims_text(kv)} per layer (past_key_values.* in, "
        "present.* out, fed by the engine)"
    )
    found.notes.extend(spec.notes)


def _spec(value: onnx.ValueInfoProto, what: str) -> TensorSpec:
    """A graph input or output as the loader describes it (dynamic dimensions as -1)."""
    if not value.type.HasField("tensor_type"):
        kind = value.type.WhichOneof("value") or "untyped"
        raise ModelLoadError(f"{what} {value.name!r} is a {kind}, which tensord cannot carry")
    tensor = value.type.tensor_type
    dtype = _DTYPES.get(tensor.elem_type)
    if dtype is None:
        name = TensorProto.DataType.Name(tensor.elem_type)
        raise ModelLoadError(f"{what} {value.name!r} has type {name}, which tensord cannot carry")
    if not tensor.HasField("shape"):
        return TensorSpec(value.name, dtype, (), rank_known=False)
    shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
    return TensorSpec(value.name, dtype, shape)


def _graph_dims(value: onnx.ValueInfoProto) -> tuple[Dim, ...]:
    dims = value.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)


def _line(spec: TensorSpec, graph_dims: tuple[Dim, ...] | None) -> TensorLine:
    """The served tensor, its dynamic dimensions named as the graph names them."""
    if not spec.rank_known:
        return TensorLine(spec.name, spec.dtype.name.lower(), None)
    named = graph_dims if graph_dims is not None and len(graph_dims) == len(spec.shape) else ()
    dims = tuple(
        (named[i] if named and isinstance(named[i], str) else "?") if d == -1 else d
        for i, d in enumerate(spec.shape)
    )
    return TensorLine(spec.name, spec.dtype.name.lower(), dims)


def _dtype_name(elem_type: int) -> str:
    dtype = _DTYPES.get(elem_type)
    return dtype.name.lower() if dtype else TensorProto.DataType.Name(elem_type).lower()


def _dims_text(dims: Sequence[Dim] | None) -> str:
    return "(no shape)" if dims is None else f"[{', '.join(str(d) for d in dims)}]"


def report_lines(check: RepositoryCheck) -> list[str]:
    """The check as lines for a person: each model with its versions' inputs and outputs,
    each problem as `model problem: NAME vN: reason`, each entry skipped and why."""
    broken = sum(m.broken for m in check.models)
    lines = [
        f"model repository {check.root}: {len(check.models)} model(s), {broken} with a "
        f"problem; {len(check.skipped)} entr{'y' if len(check.skipped) == 1 else 'ies'} skipped"
    ]
    for model in check.models:
        numbers = ", ".join(str(v.version) for v in model.versions)
        lines.append(f"  {model.name} ({model.kind}), version(s) {numbers}")
        shown: VersionCheck | None = None
        for v in model.versions:
            if v.problem:
                lines.append(f"    model problem: {model.name} v{v.version}: {v.problem}")
                continue
            if shown is not None and (v.inputs, v.outputs) == (shown.inputs, shown.outputs):
                lines.append(f"    v{v.version}: the inputs and outputs of v{shown.version}")
            else:
                lines.append(f"    v{v.version}:")
                for kind, tensors in (("input", v.inputs), ("output", v.outputs)):
                    lines += [
                        f"      {kind:<6} {t.name}: {t.dtype} {_dims_text(t.dims)}" for t in tensors
                    ]
                shown = v
            lines += [f"      note: {note}" for note in v.notes]
    for entry in check.skipped:
        where = (
            entry.path.relative_to(check.root)
            if entry.path.is_relative_to(check.root)
            else entry.path
        )
        lines.append(f"  skipped {where}: {entry.reason}")
    return lines
