"""GPU memory in the metrics, read from the device when Prometheus scrapes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# In a fresh process, so that no other test's CUDA context exists yet.
SCRIPT = """
import json
from cuda.bindings import driver, runtime as cudart
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tensord.devices import probe_gpus
from tensord.observability.collectors import GpuMemoryCollector

total = probe_gpus().gpus[0].total_memory_bytes
driver.cuInit(0)
device = driver.cuDeviceGet(0)[1]

def active():
    return int(driver.cuDevicePrimaryCtxGetState(device)[2])

def scrape():
    registry = CollectorRegistry()
    registry.register(GpuMemoryCollector(0))
    text = generate_latest(registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}

active_before = active()
before = scrape()
active_after_scrape = active()
err, ptr = cudart.cudaMalloc(256 << 20)
assert err == cudart.cudaError_t.cudaSuccess, err
after = scrape()
cudart.cudaFree(ptr)
print(json.dumps({"total": total, "active": [active_before, active_after_scrape],
                  "before": before, "after": after}))
"""


def test_gpu_memory_is_read_at_scrape_time_without_creating_a_context() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    total = found["total"]
    active_before, active_after_scrape = found["active"]
    assert active_after_scrape == active_before  # a scrape never creates a context
    before = found["before"]
    assert before["tensord_gpu_memory_total_bytes"] == total
    assert ("tensord_gpu_memory_used_bytes" in before) == bool(active_before)
    after = found["after"]  # cudaMalloc made the context: now the use is known
    assert after["tensord_gpu_memory_total_bytes"] == total
    assert 256 << 20 <= after["tensord_gpu_memory_used_bytes"] <= total
