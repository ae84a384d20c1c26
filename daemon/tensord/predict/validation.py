"""Checking a request's tensors against a model's signature before anything runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tensord.backends.base import TensorSpec
from tensord.dtypes import dtype_name, from_numpy
from tensord.errors import InvalidArgumentError


def describe_spec(spec: TensorSpec) -> str:
    """'input' (DATA_TYPE_FLOAT32 [-1, 512]), as error messages show a signature entry."""
    return f"{spec.name!r} ({dtype_name(spec.dtype)} {list(spec.shape)})"


def check_inputs(
    model: str,
    signature: Sequence[TensorSpec],
    inputs: Sequence[tuple[str, np.ndarray]],
    max_batch_size: int,
) -> dict[str, np.ndarray]:
    """The inputs as a dict, or InvalidArgumentError naming the first problem."""
    by_name = {spec.name: spec for spec in signature}
    checked: dict[str, np.ndarray] = {}
    for name, array in inputs:
        spec = by_name.get(name)
        if spec is None:
            takes = ", ".join(describe_spec(s) for s in signature)
            raise InvalidArgumentError(f"model {model!r} has no input {name!r}; it takes {takes}")
        if name in checked:
            raise InvalidArgumentError(f"input {name!r} is given more than once")
        _check_one(spec, array)
        checked[name] = array
    missing = [describe_spec(s) for s in signature if s.name not in checked]
    if missing:
        raise InvalidArgumentError(f"model {model!r} is missing input(s) {', '.join(missing)}")
    if max_batch_size:
        _check_batch(checked, max_batch_size)
    return checked


def _check_one(spec: TensorSpec, array: np.ndarray) -> None:
    got = from_numpy(array.dtype)
    if got is not spec.dtype:
        raise InvalidArgumentError(
            f"input {spec.name!r}: dtype {dtype_name(got)} does not match the model's "
            f"{dtype_name(spec.dtype)}"
        )
    shape = array.shape
    if len(shape) != len(spec.shape):
        raise InvalidArgumentError(
            f"input {spec.name!r}: shape {list(shape)} has rank {len(shape)}, but the model "
            f"expects rank {len(spec.shape)} {list(spec.shape)}"
        )
    for axis, (got_dim, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if want != -1 and got_dim != want:
            raise InvalidArgumentError(
                f"input {spec.name!r}: dimension {axis} is {got_dim}, but the model expects "
                f"{want} (shape {list(spec.shape)}, -1 is dynamic)"
            )


def _check_batch(inputs: dict[str, np.ndarray], max_batch_size: int) -> None:
    sizes = {name: array.shape[0] for name, array in inputs.items()}
    batch = next(iter(sizes.values()), 0)
    if any(size != batch for size in sizes.values()):
        raise InvalidArgumentError(f"inputs disagree on the batch (first) dimension: {sizes}")
    if batch > max_batch_size:
        raise InvalidArgumentError(
            f"batch size {batch} exceeds the model's max_batch_size {max_batch_size}; "
            "split the request"
        )


def check_output_names(
    model: str, signature: Sequence[TensorSpec], asked: Sequence[str]
) -> list[str]:
    """The outputs to compute: those asked for (validated), or all of them."""
    if not asked:
        return [spec.name for spec in signature]
    known = {spec.name for spec in signature}
    seen: set[str] = set()
    for name in asked:
        if name not in known:
            raise InvalidArgumentError(
                f"model {model!r} has no output {name!r}; its outputs are {sorted(known)}"
            )
        if name in seen:
            raise InvalidArgumentError(f"output {name!r} is asked for more than once")
        seen.add(name)
    return list(asked)
