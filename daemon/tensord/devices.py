"""What hardware this process sees: the CPU, and GPUs through cuda-python's runtime API."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from functools import cache


@dataclass(slots=True, frozen=True)
class GpuDevice:
    """One CUDA device."""

    index: int
    name: str
    total_memory_bytes: int
    compute_capability: str


@dataclass(slots=True, frozen=True)
class GpuReport:
    """The GPUs seen, the CUDA versions, or why none were seen."""

    gpus: list[GpuDevice] = field(default_factory=list)
    driver_version: str = ""
    runtime_version: str = ""
    unavailable_reason: str = ""


@dataclass(slots=True, frozen=True)
class CpuReport:
    """The host CPU."""

    model: str
    architecture: str
    logical_cores: int


def _cuda_version(value: int) -> str:
    # CUDA encodes versions as 1000 * major + 10 * minor.
    return f"{value // 1000}.{(value % 1000) // 10}" if value else ""


@cache
def probe_gpus() -> GpuReport:
    """Ask the CUDA runtime for devices; never raises (a host without a driver is normal)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        return GpuReport(unavailable_reason=f"cuda-bindings is not installed ({exc})")
    try:
        err, runtime = cudart.cudaRuntimeGetVersion()
        runtime_version = _cuda_version(runtime) if err == cudart.cudaError_t.cudaSuccess else ""
        err, driver = cudart.cudaDriverGetVersion()
        driver_version = _cuda_version(driver) if err == cudart.cudaError_t.cudaSuccess else ""
        err, count = cudart.cudaGetDeviceCount()
        if err != cudart.cudaError_t.cudaSuccess:
            _, name = cudart.cudaGetErrorName(err)
            _, text = cudart.cudaGetErrorString(err)
            reason = f"cudaGetDeviceCount failed: {name.decode()}: {text.decode()}"
            if not driver_version:
                reason = f"no NVIDIA driver is installed or visible to this process ({reason})"
            return GpuReport([], driver_version, runtime_version, reason)
        gpus = []
        for index in range(count):
            err, props = cudart.cudaGetDeviceProperties(index)
            if err != cudart.cudaError_t.cudaSuccess:
                continue
            gpus.append(
                GpuDevice(
                    index,
                    props.name.split(b"\0", 1)[0].decode(errors="replace"),
                    int(props.totalGlobalMem),
                    f"{props.major}.{props.minor}",
                )
            )
        reason = "" if gpus else "the CUDA runtime reports no devices"
        return GpuReport(gpus, driver_version, runtime_version, reason)
    except Exception as exc:  # driver libraries missing or broken: report, never fail
        return GpuReport(unavailable_reason=f"CUDA probe failed: {exc}")


@cache
def probe_cpu() -> CpuReport:
    """CPU model name, architecture and the cores this process may use."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return CpuReport(model or "unknown", platform.machine(), cores)
