"""Tensors between the Open Inference Protocol's (KServe v2) messages and NumPy arrays.

The protocol names element types by strings ("FP32", "BYTES"), carries each input either
as one entry of `raw_input_contents` (little-endian C-order bytes; BYTES elements as a
4-byte little-endian length then the bytes, as tensord.v1's STRING) or as typed
`contents`, and answers with `raw_output_contents`, as Triton does.
"""

from __future__ import annotations

import math

import numpy as np

from tensord.dtypes import DType, from_numpy
from tensord.errors import InvalidArgumentError
from tensord.kserve.v2 import grpc_service_pb2 as pb
from tensord.server.kit.tensors import (
    MAX_RANK,
    TENSOR_STEPS,
    check_shape,
    decode_contents,
    decode_raw,
    encode_raw_strings,
)

DATATYPES: dict[DType, str] = {
    DType.BOOL: "BOOL",
    DType.UINT8: "UINT8",
    DType.INT8: "INT8",
    DType.INT16: "INT16",
    DType.INT32: "INT32",
    DType.INT64: "INT64",
    DType.FLOAT16: "FP16",
    DType.BFLOAT16: "BF16",
    DType.FLOAT32: "FP32",
    DType.FLOAT64: "FP64",
    DType.STRING: "BYTES",
}
"""The protocol's name of each element type tensord carries."""
_FROM_NAME = {name: dtype for dtype, name in DATATYPES.items()}
_NAMES = ", ".join(DATATYPES.values())
_UNSUPPORTED = ("UINT16", "UINT32", "UINT64")

# InferTensorContents: the field that carries each type's typed values (FP16 and BF16 have
# none: they travel in raw_input_contents only).
_CONTENTS: dict[DType, str] = {
    DType.BOOL: "bool_contents",
    DType.UINT8: "uint_contents",
    DType.INT8: "int_contents",
    DType.INT16: "int_contents",
    DType.INT32: "int_contents",
    DType.INT64: "int64_contents",
    DType.FLOAT32: "fp32_contents",
    DType.FLOAT64: "fp64_contents",
    DType.STRING: "bytes_contents",
}
_CONTENTS_FIELDS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)


def datatype(name: str, label: str) -> DType:
    """The DType of a protocol datatype string; INVALID_ARGUMENT for one tensord lacks."""
    dtype = _FROM_NAME.get(name)
    if dtype is not None:
        return dtype
    why = "tensord's models take no unsigned 16/32/64-bit tensors; " if name in _UNSUPPORTED else ""
    raise InvalidArgumentError(
        f"{label}: datatype {name[:64]!r} is not supported; {why}expected one of {_NAMES}"
    )


def decode_cost(request: pb.ModelInferRequest) -> int:
    """Roughly how many Python-level element steps decoding the inputs takes."""
    steps = TENSOR_STEPS * len(request.inputs)
    for tensor in request.inputs:
        contents = tensor.contents
        steps += sum(len(getattr(contents, field)) for field in _CONTENTS_FIELDS)
        if tensor.datatype == "BYTES":
            steps += math.prod(tensor.shape) if len(tensor.shape) <= MAX_RANK else 0
    return steps


def decode_inputs(request: pb.ModelInferRequest) -> list[tuple[str, np.ndarray]]:
    """(name, array) for each input; raw entries are wrapped without copying (read-only)."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgumentError(
            f"raw_input_contents has {len(raw)} entries but the request has "
            f"{len(request.inputs)} inputs; give one per input, in the inputs' order"
        )
    return [
        _decode_input(tensor, raw[i] if raw else None, f"inputs[{i}] {tensor.name!r}")
        for i, tensor in enumerate(request.inputs)
    ]


def _decode_input(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None, label: str
) -> tuple[str, np.ndarray]:
    for key in tensor.parameters:
        if key.startswith("shared_memory"):
            raise InvalidArgumentError(
                f"{label}: parameter {key!r}: tensord has no shared-memory regions; send the "
                "tensor in raw_input_contents or contents"
            )
    dtype = datatype(tensor.datatype, label)
    shape = tuple(tensor.shape)
    count = check_shape(shape, label, dtype.itemsize)
    if raw is not None:
        if tensor.HasField("contents"):
            raise InvalidArgumentError(
                f"{label}: has contents while the request uses raw_input_contents; a request "
                "carries all its inputs one way or the other"
            )
        array = decode_raw(raw, dtype, shape, count, label, "raw_input_contents", DATATYPES[dtype])
        return tensor.name, array
    return tensor.name, _decode_contents(tensor.contents, dtype, shape, count, label)


def _decode_contents(
    contents: pb.InferTensorContents, dtype: DType, shape: tuple[int, ...], count: int, label: str
) -> np.ndarray:
    field = _CONTENTS.get(dtype)
    if field is None:
        raise InvalidArgumentError(
            f"{label}: {DATATYPES[dtype]} tensors travel in raw_input_contents (the protocol "
            "has no typed contents for them)"
        )
    return decode_contents(
        contents, dtype, shape, count, label, field, _CONTENTS_FIELDS, DATATYPES[dtype]
    )


def output_datatype(array: np.ndarray, name: str) -> str:
    """The protocol's datatype of an output array."""
    try:
        return DATATYPES[from_numpy(array.dtype)]
    except ValueError as exc:
        raise InvalidArgumentError(f"output {name!r}: {exc}") from None


def fill_outputs(response: pb.ModelInferResponse, outputs: list[tuple[str, np.ndarray]]) -> None:
    """Each output's name, datatype and shape, and its bytes in raw_output_contents."""
    for name, array in outputs:
        kind = output_datatype(array, name)
        response.outputs.add(name=name, datatype=kind, shape=array.shape)
        if kind == "BYTES":
            response.raw_output_contents.append(encode_raw_strings(array.reshape(-1)))
        else:
            response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
