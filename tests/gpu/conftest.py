"""GPU tests run only where a CUDA device is visible; elsewhere they are skipped, never faked."""

from __future__ import annotations

import pytest

from tensord.devices import probe_gpus


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    report = probe_gpus()
    if report.gpus:
        return
    skip = pytest.mark.skip(reason=f"no CUDA device: {report.unavailable_reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
