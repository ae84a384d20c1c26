"""Finding the CUDA provider's libraries, checked on any host with real shared libraries
standing in for the nvidia-* wheels' (dlopen does the loading; nothing is faked)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tensord.backends import cuda_libraries
from tensord.backends.cuda_libraries import (
    LibraryReport,
    is_loaded,
    load_missing,
    nvidia_library_folders,
    prepare,
    required_libraries,
)

LIBZ = Path("/usr/lib/x86_64-linux-gnu/libz.so.1")


def test_the_libraries_are_onnxruntimes_for_its_cuda_major() -> None:
    assert required_libraries("13.0") == [
        "libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libcurand.so.10",
        "libcufft.so.12", "libcudnn.so.9",
    ]  # fmt: skip
    assert required_libraries("12.8")[4] == "libcufft.so.11"


def test_is_loaded_reads_the_process_not_the_disk() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6")
    assert is_loaded("libc.so.6")
    assert not is_loaded("libtensord-nothing.so.1")


@pytest.fixture
def nvidia_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site folder whose nvidia/cu13/lib holds a real library under a CUDA soname, first
    on the import path (as the image's nvidia-* wheels are beside a --target install)."""
    if not LIBZ.exists():
        pytest.skip(f"{LIBZ} is not on this host")
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "site" / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    shutil.copy(LIBZ, lib / "libcurand.so.10")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sys.modules.pop("nvidia", None)
    return lib


def test_missing_libraries_are_found_in_the_nvidia_wheels_on_the_path(nvidia_tree: Path) -> None:
    folders = nvidia_library_folders()
    assert nvidia_tree in folders and nvidia_tree.parent.parent / "cudnn" / "lib" in folders
    report = LibraryReport()
    load_missing(["libcurand.so.10", "libtensord-absent.so.1"], folders, report)
    assert report.loaded == {"libcurand.so.10": str(nvidia_tree)}
    assert report.missing == ["libtensord-absent.so.1"]
    assert report.describe() == (
        f"loaded libcurand.so.10 ({nvidia_tree}); missing libtensord-absent.so.1: sessions "
        "on the CUDA provider may fail"
    )


def test_prepare_says_what_preload_dlls_loaded_and_what_is_missing(
    nvidia_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def preload(**flags: bool) -> None:  # onnxruntime's prints what it cannot load
        calls.append(flags)
        print("Failed to load libcudart.so.13")

    monkeypatch.setattr(
        cuda_libraries,
        "required_libraries",
        lambda v: ["libc.so.6", "libcurand.so.10", "libcudnn.so.9"],
    )
    report = prepare("13.0", preload)
    assert calls == [{"cuda": True, "cudnn": True, "msvc": False}]
    assert report.loaded == {"libc.so.6": "already loaded", "libcurand.so.10": str(nvidia_tree)}
    assert report.missing == ["libcudnn.so.9"]


def test_a_cpu_build_needs_no_cuda_libraries() -> None:
    import onnxruntime as ort

    from tensord.backends.ort_session import prepare_cuda_libraries

    if getattr(ort, "cuda_version", ""):
        pytest.skip("this ONNX Runtime is a CUDA build")
    assert prepare_cuda_libraries().endswith("is not a CUDA build: no CUDA libraries to load")
