"""Meets a real sticky CUDA error: a kernel stores to an unmapped address, and the checked
cudaStreamSynchronize that follows must raise StickyCudaError (a DeviceLostError), as must
the next CUDA call. Run as its own process (python -m tests.gpu.illegal_address): the CUDA
context of the process is unusable afterwards. Prints one JSON line."""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

from cuda.bindings import driver
from cuda.bindings import runtime as cudart

from tensord.cuda.runtime import StickyCudaError, check
from tensord.errors import DeviceLostError
from tensord.kernels.compiler import arch_for, compile_source

KERNEL = rb"""
extern "C" __global__ void poke(int* nowhere) { *nowhere = 1; }
"""


def _ok(result: Any, call: str) -> Any:
    values = result if isinstance(result, tuple) else (result,)
    if int(values[0]) != 0:
        raise RuntimeError(f"{call} failed: {values[0]}")
    return values[1] if len(values) == 2 else values[1:]


def compile_poke(device: int) -> Any:
    """The kernel as a CUBIN for this device (PTX would be left to the driver's JIT, which
    a driver older than NVRTC refuses)."""
    props = check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    arch = arch_for(int(props.major), int(props.minor))
    cubin = compile_source(KERNEL, "poke.cu", arch, options=()).cubin
    module = _ok(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
    return _ok(driver.cuModuleGetFunction(module, b"poke"), "cuModuleGetFunction")


def main() -> int:
    check(cudart.cudaSetDevice(0), "cudaSetDevice")
    stream = check(cudart.cudaStreamCreate(), "cudaStreamCreate")
    kernel = compile_poke(0)
    args = ((0x10,), (ctypes.c_void_p,))
    _ok(
        driver.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, driver.CUstream(int(stream)), args, 0),
        "cuLaunchKernel",
    )
    report: dict[str, Any] = {}
    for step, call in (
        ("sync", lambda: check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")),
        ("after", lambda: check(cudart.cudaMalloc(16), "cudaMalloc")),
    ):
        try:
            call()
            report[step] = "no error"
        except StickyCudaError as exc:
            report[step] = {
                "error": exc.error_name,
                "device_lost": isinstance(exc, DeviceLostError),
            }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
