"""A model's served signature: the backend's own, narrowed by model.toml overrides."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tensord import dtypes
from tensord.backends.base import TensorSpec
from tensord.errors import ModelLoadError
from tensord.modelconfig.model import ModelConfig, TensorOverride


def apply_overrides(
    specs: Sequence[TensorSpec], overrides: Sequence[TensorOverride], what: str
) -> list[TensorSpec]:
    """Apply overrides; each must name a real tensor and stay compatible with the model."""
    by_name = {spec.name: spec for spec in specs}
    for i, override in enumerate(overrides):
        spec = by_name.get(override.name)
        where = f"model.toml {what}[{i}] {override.name!r}"
        if spec is None:
            raise ModelLoadError(
                f"{where}: the model has no {what[:-1]} of that name; it has {sorted(by_name)}"
            )
        if override.dtype is not None and dtypes.parse(override.dtype) is not spec.dtype:
            raise ModelLoadError(
                f"{where}: dtype {override.dtype} does not match the model's "
                f"{spec.dtype.name.lower()}"
            )
        if override.shape is not None:
            shape = tuple(override.shape)
            if spec.rank_known:
                shape = _narrow(spec.shape, shape, where)
            by_name[spec.name] = replace(spec, shape=shape, rank_known=True)
    if what == "inputs":
        for spec in by_name.values():
            if not spec.rank_known:
                raise ModelLoadError(
                    f"input {spec.name!r} has no shape in the model, not even a rank, so "
                    "requests cannot be checked against it: give it one in model.toml, e.g. "
                    f'[[inputs]] name = "{spec.name}" shape = [-1, 3] (-1: any size)'
                )
    return [by_name[spec.name] for spec in specs]


def _narrow(model: tuple[int, ...], wanted: tuple[int, ...], where: str) -> tuple[int, ...]:
    if len(model) != len(wanted):
        raise ModelLoadError(
            f"{where}: shape {list(wanted)} has rank {len(wanted)}, "
            f"the model's {list(model)} has {len(model)}"
        )
    for i, (m, w) in enumerate(zip(model, wanted, strict=True)):
        if m != -1 and w != m:
            raise ModelLoadError(
                f"{where}: dimension {i} is fixed to {m} in the model, cannot be {w}"
            )
    return wanted


def check_batching(config: ModelConfig, specs: Sequence[TensorSpec]) -> None:
    """With max_batch_size > 0, every tensor's first dimension must be the dynamic batch."""
    if config.max_batch_size == 0:
        return
    for spec in specs:
        if not spec.rank_known:
            raise ModelLoadError(
                f"max_batch_size {config.max_batch_size} needs a dynamic first (batch) "
                f"dimension, but {spec.name!r} has no shape in the model, not even a rank; "
                f'give it one in model.toml, e.g. [[outputs]] name = "{spec.name}" '
                "shape = [-1, 10]"
            )
        if not spec.shape or spec.shape[0] != -1:
            raise ModelLoadError(
                f"max_batch_size {config.max_batch_size} needs a dynamic first (batch) dimension, "
                f"but {spec.name!r} has shape {list(spec.shape)}; set max_batch_size = 0 or export "
                "the model with a dynamic batch axis"
            )
