"""GPU tests run only where a CUDA device is visible; elsewhere they are skipped, never faked.

With TENSORD_REQUIRE_GPU=1 (the offline GPU run sets it) a GPU test that would be skipped
fails instead, with what the probe saw: on a host that should have a device, a driver too
old for the bindings must not pass as "no GPU".
"""

from __future__ import annotations

import os

import pytest

from tensord.devices import probe_gpus

REQUIRE_GPU = "TENSORD_REQUIRE_GPU"
_MISSING = pytest.StashKey[str]()


def require_gpu() -> bool:
    """Whether TENSORD_REQUIRE_GPU asks for every GPU test to run."""
    return os.environ.get(REQUIRE_GPU, "") not in ("", "0", "false", "no")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    report = probe_gpus()
    if report.gpus:
        return
    reason = f"no CUDA device: {report.unavailable_reason}"
    if require_gpu():
        config.stash[_MISSING] = reason  # each GPU test fails at its setup, saying why
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item: pytest.Item) -> None:
    missing = item.config.stash.get(_MISSING, "")
    if missing and "gpu" in item.keywords:
        pytest.fail(f"{REQUIRE_GPU}=1, but {missing}", pytrace=False)
