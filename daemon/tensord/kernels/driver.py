"""Kernels on a device through the CUDA driver API (`cuda.bindings.driver`).

Modules are loaded with cuModuleLoadData into the device's primary context (the one the
CUDA runtime, and so the executor, uses), functions found with cuModuleGetFunction, and
every launch goes through cuLaunchKernel on the caller's stream with its result checked.
Errors during execution surface at the stream's next synchronisation, which the
executor checks.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from tensord.cuda.device_fault import sticky_error_in
from tensord.errors import DeviceLostError, InternalError
from tensord.kernels.cache import CachedKernel, cached_cubin, forget
from tensord.kernels.compiler import arch_for, nvrtc_library, nvrtc_version
from tensord.kernels.sources import FAMILIES

log = structlog.get_logger("tensord.kernels")

Arg = tuple[Any, Any]
"""One kernel argument: (value, ctypes type), or (ctypes.Structure, None)."""


class DriverError(InternalError):
    """A CUDA driver API call failed."""

    def __init__(self, call: str, error: Any) -> None:
        from cuda.bindings import driver

        _, name = driver.cuGetErrorName(error)
        _, text = driver.cuGetErrorString(error)
        self.call = call
        self.error_name = name.decode() if isinstance(name, bytes) else str(name)
        detail = text.decode() if isinstance(text, bytes) else str(text)
        super().__init__(f"{call} failed: {self.error_name}: {detail}")


class StickyDriverError(DriverError, DeviceLostError):
    """A driver error after which the context is lost (an illegal address in a kernel, say):
    like the runtime's StickyCudaError, the daemon drains and exits non-zero."""


def driver_error_type(error: Any) -> type[DriverError]:
    """StickyDriverError for the driver's names of the sticky errors (device_fault.py)."""
    name = getattr(error, "name", str(error))  # CUresult members carry their enum name
    return StickyDriverError if sticky_error_in(name) else DriverError


def drv_check(result: Any, call: str) -> Any:
    """The values of a driver call's result, or DriverError naming the call."""
    from cuda.bindings import driver

    values = result if isinstance(result, tuple) else (result,)
    if values[0] != driver.CUresult.CUDA_SUCCESS:
        raise driver_error_type(values[0])(call, values[0])
    rest = values[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def pointer(value: int) -> Arg:
    """A device pointer argument."""
    return (value, ctypes.c_void_p)


def i32(value: int) -> Arg:
    """An int argument."""
    return (int(value), ctypes.c_int)


def i64(value: int) -> Arg:
    """A long long argument."""
    return (int(value), ctypes.c_longlong)


def f32(value: float) -> Arg:
    """A float argument."""
    return (float(value), ctypes.c_float)


@dataclass(slots=True)
class DeviceKernels:
    """Every kernel family loaded on one device: function handles by name."""

    device_id: int
    arch: str
    functions: dict[str, Any] = field(default_factory=dict)
    modules: list[Any] = field(default_factory=list)
    from_cache: dict[str, bool] = field(default_factory=dict)

    def launch(
        self,
        name: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Arg],
        stream: int,
        shared_bytes: int = 0,
    ) -> None:
        """cuLaunchKernel on `stream` (a cudaStream_t address), checked."""
        from cuda.bindings import driver

        if min(grid) < 1:
            return  # nothing to do (an empty batch); a zero grid is a launch error
        values = tuple(a[0] for a in args)
        types = tuple(a[1] for a in args)
        drv_check(
            driver.cuLaunchKernel(
                self.functions[name],
                *grid,
                *block,
                shared_bytes,
                driver.CUstream(int(stream)),
                (values, types),
                0,
            ),
            f"cuLaunchKernel {name}",
        )

    def describe(self) -> str:
        """e.g. "sm_90 (cached)" for Info."""
        cached = all(self.from_cache.values()) and bool(self.from_cache)
        return f"{self.arch}, {'loaded from the cache' if cached else 'compiled with NVRTC'}"


_LOADED: dict[tuple[int, frozenset[str]], DeviceKernels] = {}
_LOCK = threading.Lock()


def _load_module(entry: CachedKernel) -> Any:
    from cuda.bindings import driver

    return drv_check(driver.cuModuleLoadData(entry.cubin), f"cuModuleLoadData {entry.family}")


def load_kernels(device_id: int, cache_directory: Path, families: Iterable[str]) -> DeviceKernels:
    """The families compiled (or read from the cache) for the device and loaded into its
    primary context; loaded once per process and device."""
    wanted = frozenset(families)
    with _LOCK:
        found = _LOADED.get((device_id, wanted))
        if found is not None:
            return found
        from cuda.bindings import runtime as cudart

        from tensord.cuda.runtime import check

        check(cudart.cudaSetDevice(device_id), "cudaSetDevice")
        check(cudart.cudaFree(0), "cudaFree(0) (create the primary context)")
        props = check(cudart.cudaGetDeviceProperties(device_id), "cudaGetDeviceProperties")
        kernels = DeviceKernels(device_id, arch_for(int(props.major), int(props.minor)))
        for family in sorted(wanted):
            entry = cached_cubin(family, kernels.arch, cache_directory)
            try:
                module = _load_module(entry)
            except DriverError as exc:
                if not entry.from_cache:
                    raise
                log.warning("kernels.cache_rejected", family=family, error=str(exc))
                forget(entry)
                entry = cached_cubin(family, kernels.arch, cache_directory, refresh=True)
                module = _load_module(entry)
            kernels.modules.append(module)
            kernels.from_cache[family] = entry.from_cache
            for name in FAMILIES[family].functions:
                kernels.functions[name] = drv_check(
                    driver_get_function(module, name), f"cuModuleGetFunction {name}"
                )
        _LOADED[(device_id, wanted)] = kernels
        log.info(
            "kernels.loaded",
            device=device_id,
            arch=kernels.arch,
            families=sorted(wanted),
            nvrtc=".".join(map(str, nvrtc_version())),
            nvrtc_library=nvrtc_library(),
        )
        return kernels


def driver_get_function(module: Any, name: str) -> Any:
    """cuModuleGetFunction's raw result for `name`."""
    from cuda.bindings import driver

    return driver.cuModuleGetFunction(module, name.encode())
