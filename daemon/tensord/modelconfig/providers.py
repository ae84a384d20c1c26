"""Execution provider names as model.toml and the daemon config write them."""

from __future__ import annotations

CPU = "CPUExecutionProvider"

# Highest priority first. CPU is always the last resort.
PRIORITY: tuple[str, ...] = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "ROCMExecutionProvider",
    "CoreMLExecutionProvider",
    "DmlExecutionProvider",
    "OpenVINOExecutionProvider",
    CPU,
)

_ALIASES = {
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "directml": "DmlExecutionProvider",
    "dml": "DmlExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "cpu": CPU,
}


def normalise_provider(name: str) -> str:
    """Accept "cuda" or "CUDAExecutionProvider"; raise ValueError for unknown names."""
    if name in PRIORITY:
        return name
    full = _ALIASES.get(name.lower())
    if full is None:
        known = ", ".join(sorted(_ALIASES))
        raise ValueError(f"unknown execution provider {name!r}; expected one of {known}")
    return full
