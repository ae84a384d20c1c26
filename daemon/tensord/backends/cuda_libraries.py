"""The CUDA and cuDNN libraries onnxruntime-gpu's CUDA provider needs, found and loaded
before its first session.

The provider library has no RUNPATH to them. `onnxruntime.preload_dlls` loads them from the
`nvidia/` folder beside the onnxruntime package (the nvidia-* wheels installed into the same
site-packages), else by soname from the library path, and only prints what it could not
load. Where onnxruntime-gpu sits elsewhere (a `--target` folder, a system package, a second
virtualenv layered over one that holds the nvidia-* wheels) the provider then fails to load
and sessions quietly start on the CPU. So after preload_dlls each library is checked, the
missing ones are looked for in every `nvidia/<package>/lib` folder on the import path, and
the outcome names what was loaded from where and what is still missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
from dataclasses import dataclass, field
from importlib import util
from pathlib import Path


@dataclass(slots=True)
class LibraryReport:
    """Which of the libraries were loaded, from where, and which were not."""

    loaded: dict[str, str] = field(default_factory=dict)
    """soname -> where it came from ("preload_dlls", a path, or "already loaded")."""
    missing: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if not self.loaded and not self.missing:
            return "no CUDA libraries are needed"
        found: dict[str, list[str]] = {}
        for name, where in self.loaded.items():
            found.setdefault(where, []).append(name)
        parts = [f"{', '.join(names)} ({where})" for where, names in found.items()]
        text = "loaded " + "; ".join(parts) if parts else "loaded none"
        if self.missing:
            text += f"; missing {', '.join(self.missing)}: sessions on the CUDA provider may fail"
        return text


def required_libraries(cuda_version: str) -> list[str]:
    """The sonames the CUDA provider of an onnxruntime-gpu built for `cuda_version` loads,
    in dependency order (cuBLASLt before cuBLAS), as its preload_dlls lists them on Linux."""
    major = cuda_version.split(".", 1)[0]
    cufft = "12" if major.isdigit() and int(major) >= 13 else "11"
    return [
        f"libcudart.so.{major}",
        f"libcublasLt.so.{major}",
        f"libcublas.so.{major}",
        "libcurand.so.10",
        f"libcufft.so.{cufft}",
        "libcudnn.so.9",
    ]


def is_loaded(soname: str) -> bool:
    """Whether a library of this soname is already in the process (dlopen RTLD_NOLOAD)."""
    try:
        ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def nvidia_library_folders() -> list[Path]:
    """Every `nvidia/<package>/lib` folder of the nvidia-* wheels on the import path."""
    spec = util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    folders = []
    for root in spec.submodule_search_locations:
        folders.extend(sorted(p for p in Path(root).glob("*/lib") if p.is_dir()))
    return folders


def load_missing(names: list[str], folders: list[Path], report: LibraryReport) -> None:
    """Load each library not yet in the process from the first folder that has it."""
    for name in names:
        if name in report.loaded:
            continue
        for folder in folders:
            path = folder / name
            if not path.is_file():
                continue
            try:
                ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL)
            except OSError:
                continue
            report.loaded[name] = str(folder)
            break
        else:
            report.missing.append(name)


def prepare(cuda_version: str, preload: object = None) -> LibraryReport:
    """Load what the CUDA provider needs: preload_dlls first (its printing kept out of the
    daemon's output), then the nvidia-* wheels anywhere on the import path."""
    report = LibraryReport()
    names = required_libraries(cuda_version)
    already = {name for name in names if is_loaded(name)}
    if callable(preload):
        # It raises only for an unusable directory, and prints what it could not load.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
            preload(cuda=True, cudnn=True, msvc=False)
    for name in names:
        if name in already:
            report.loaded[name] = "already loaded"
        elif is_loaded(name):
            report.loaded[name] = "preload_dlls"
    load_missing(names, nvidia_library_folders(), report)
    return report
