"""NVRTC through cuda-python (`cuda.bindings.nvrtc`): CUDA C -> CUBIN for one architecture.

NVRTC needs no GPU and no driver. cuda-bindings finds libnvrtc through cuda-pathfinder:
in the `nvidia-cuda-nvrtc` wheel's `nvidia/cu*/lib` of the same environment (the `cpu`
and `gpu` extras install it), else a CUDA toolkit on the library path, so a plain
virtualenv without a toolkit compiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from tensord.kernels.sources import SourceBundle

# --fmad=false: no fused multiply-adds, so every float step rounds as NumPy's does.
COMPILE_OPTIONS: tuple[str, ...] = (
    "--fmad=false",
    "--std=c++17",
    "--device-as-default-execution-space",
)


class NvrtcError(RuntimeError):
    """NVRTC is missing or failed; the message carries the compiler's log."""


def _check(result: Any, call: str) -> Any:
    from cuda.bindings import nvrtc

    values = result if isinstance(result, tuple) else (result,)
    if values[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(values[0])
        name = text.decode() if isinstance(text, bytes) else str(text)
        raise NvrtcError(f"{call} failed: {name}")
    rest = values[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


@cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library cuda-bindings loaded; NvrtcError if none."""
    try:
        from cuda.bindings import nvrtc

        major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    except NvrtcError:
        raise
    except Exception as exc:  # ImportError, or the library not found by cuda-pathfinder
        raise NvrtcError(
            f"NVRTC is not available ({exc}); install the nvidia-cuda-nvrtc wheel "
            "(the tensord[cpu] and tensord[gpu] extras carry it)"
        ) from None
    return int(major), int(minor)


def nvrtc_library() -> str:
    """Where libnvrtc was found (for logs and Info), or why not."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return str(load_nvidia_dynamic_lib("nvrtc").abs_path)
    except Exception as exc:
        return f"not found ({exc})"


@cache
def supported_archs() -> tuple[int, ...]:
    """The real architectures this NVRTC compiles for, e.g. (75, 80, 86, 89, 90, ...)."""
    from cuda.bindings import nvrtc

    nvrtc_version()
    return tuple(int(a) for a in _check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


def arch_for(major: int, minor: int) -> str:
    """The CUBIN architecture for a device: its own, or the newest same-major one below it
    that NVRTC supports (CUBINs run on later minor versions of their major)."""
    wanted = major * 10 + minor
    usable = [a for a in supported_archs() if a // 10 == major and a <= wanted]
    if not usable:
        raise NvrtcError(
            f"NVRTC {'.'.join(map(str, nvrtc_version()))} cannot compile for compute capability "
            f"{major}.{minor}; it supports sm_{', sm_'.join(map(str, supported_archs()))}"
        )
    return f"sm_{max(usable)}"


@dataclass(slots=True, frozen=True)
class Compiled:
    """A CUBIN and the compiler's log (warnings)."""

    cubin: bytes
    log: str


def _log(prog: Any) -> str:
    from cuda.bindings import nvrtc

    size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    # NVRTC writes into the buffer: it must be a fresh mutable one. (b" " * 1 is CPython's
    # shared b" " object, which a write would change for the whole process.)
    buffer = bytearray(size)
    _check(nvrtc.nvrtcGetProgramLog(prog, buffer), "nvrtcGetProgramLog")
    return bytes(buffer).rstrip(b"\0 ").decode(errors="replace")


def compile_cubin(
    bundle: SourceBundle, arch: str, options: tuple[str, ...] = COMPILE_OPTIONS
) -> Compiled:
    """Compile one family for `arch` (e.g. "sm_90"); NvrtcError with the log on failure."""
    return compile_source(bundle.source, bundle.family.file, arch, options, bundle.headers)


def compile_source(
    source: bytes | str,
    filename: str,
    arch: str,
    options: tuple[str, ...] = COMPILE_OPTIONS,
    headers: tuple[tuple[str, bytes], ...] = (),
) -> Compiled:
    """CUDA C to a CUBIN for `arch` (e.g. "sm_90", from arch_for): the device runs it as it
    is, so no PTX is left for the driver to JIT (a driver older than NVRTC's PTX ISA
    refuses the PTX). NvrtcError with the log on failure."""
    from cuda.bindings import nvrtc

    nvrtc_version()
    text = source.encode() if isinstance(source, str) else source
    names = [name.encode() for name, _ in headers]
    texts = [header for _, header in headers]
    prog = _check(
        nvrtc.nvrtcCreateProgram(text, filename.encode(), len(texts), texts, names),
        "nvrtcCreateProgram",
    )
    try:
        args = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(args), args)
        log = _log(prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"{filename} does not compile for {arch}:\n{log}")
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return Compiled(bytes(cubin), log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
