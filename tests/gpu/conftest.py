"""GPU tests run only where a CUDA device is visible; elsewhere they are skipped, never faked.

With TENSORD_REQUIRE_GPU=1 (the offline GPU run sets it) a GPU test that would be skipped
fails instead, with what the probe saw: on a host that should have a device, a driver too
old for the bindings must not pass as "no GPU".

Tests marked `ort_gpu` also need onnxruntime-gpu's CUDAExecutionProvider: without it they
are skipped, or fail under TENSORD_REQUIRE_GPU=1 (deselect them with `-m "not ort_gpu"`
where onnxruntime-gpu is knowingly absent; tests/gpu/run-offline.sh does, and says so).
"""

from __future__ import annotations

import os

import pytest

from tensord.devices import probe_gpus

REQUIRE_GPU = "TENSORD_REQUIRE_GPU"
_MISSING = pytest.StashKey[dict[str, str]]()


def require_gpu() -> bool:
    """Whether TENSORD_REQUIRE_GPU asks for every GPU test to run."""
    return os.environ.get(REQUIRE_GPU, "") not in ("", "0", "false", "no")


def cuda_provider_missing() -> str:
    """Why ONNX Runtime has no CUDAExecutionProvider here, or "" when it has one."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return f"ONNX Runtime is not installed ({exc})"
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" in providers:
        return ""
    return (
        f"this ONNX Runtime ({ort.__version__}, providers {', '.join(providers)}) has no "
        "CUDAExecutionProvider: install onnxruntime-gpu (make setup-gpu)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    report = probe_gpus()
    missing = {
        "gpu": "" if report.gpus else f"no CUDA device: {report.unavailable_reason}",
        "ort_gpu": cuda_provider_missing()
        if any("ort_gpu" in item.keywords for item in items)
        else "",
    }
    if require_gpu():
        config.stash[_MISSING] = missing  # each such test fails at its setup, saying why
        return
    for item in items:
        for marker, reason in missing.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
                break


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, reason in item.config.stash.get(_MISSING, {}).items():
        if reason and marker in item.keywords:
            pytest.fail(f"{REQUIRE_GPU}=1, but {reason}", pytrace=False)
