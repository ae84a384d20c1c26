"""Every kernel family compiles with the real NVRTC (no GPU needed), the cache is keyed
right, and an installed tensord carries the CUDA sources."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from tensord.kernels import cache
from tensord.kernels.compiler import (
    COMPILE_OPTIONS,
    NvrtcError,
    arch_for,
    compile_cubin,
    nvrtc_library,
    nvrtc_version,
)
from tensord.kernels.sources import FAMILIES, load_source, source_dir
from tests.tools import require_module

ROOT = Path(__file__).resolve().parents[3]


def test_every_cu_file_is_a_known_family() -> None:
    on_disk = {p.name for p in (ROOT / "kernels").glob("*.cu")}
    assert on_disk == {f.file for f in FAMILIES.values()}
    assert source_dir() in (ROOT / "kernels", ROOT / "daemon" / "tensord" / "kernels" / "cuda")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_compiles_to_cubin(family: str, arch: str) -> None:
    compiled = compile_cubin(load_source(family), arch)
    assert compiled.cubin[:4] == b"\x7fELF"  # a CUBIN is an ELF image
    for function in FAMILIES[family].functions:
        assert function.encode() in compiled.cubin, f"{function} missing from {family} {arch}"
    assert "warning" not in compiled.log.lower(), compiled.log


def test_compiling_leaves_python_objects_alone() -> None:
    # NVRTC writes its (one-byte, empty) log into the buffer it is given: a shared object
    # such as b" " would be changed for the whole process.
    compile_cubin(load_source("preprocess"), "sm_80")
    assert bytes([32]) == b" " and b"a b".split(b" ") == [b"a", b"b"]


def test_exactness_options_are_on() -> None:
    assert "--fmad=false" in COMPILE_OPTIONS
    assert not any("fast-math" in o or "ftz=true" in o for o in COMPILE_OPTIONS)


def test_compile_error_carries_the_log() -> None:
    bundle = load_source("preprocess")
    broken = replace(bundle, source=bundle.source + b"\nthis is not CUDA;\n")
    with pytest.raises(NvrtcError, match=r"preprocess.cu does not compile for sm_90:\n.*error"):
        compile_cubin(broken, "sm_90")


def test_nvrtc_is_found_without_a_toolkit() -> None:
    # cuda-bindings finds libnvrtc through cuda-pathfinder: the nvidia-cuda-nvrtc wheel.
    assert "libnvrtc" in nvrtc_library()
    assert nvrtc_version() >= (12, 0)


def test_arch_choice() -> None:
    assert arch_for(9, 0) == "sm_90"
    assert arch_for(8, 0) == "sm_80"
    assert arch_for(8, 6) == "sm_86"
    with pytest.raises(NvrtcError, match=r"cannot compile for compute capability 1\.0"):
        arch_for(1, 0)


def test_cache_compiles_once_then_reads(tmp_path: Path) -> None:
    first = cache.cached_cubin("softmax_topk", "sm_80", tmp_path)
    assert not first.from_cache
    assert first.path.parent == tmp_path / "kernels"
    assert first.path.name.startswith(
        f"softmax_topk-sm_80-nvrtc{'.'.join(map(str, nvrtc_version()))}-"
    )
    second = cache.cached_cubin("softmax_topk", "sm_80", tmp_path)
    assert second.from_cache and second.cubin == first.cubin and second.path == first.path
    other_arch = cache.cached_cubin("softmax_topk", "sm_90", tmp_path)
    assert not other_arch.from_cache and other_arch.path != first.path
    cache.forget(second)
    assert not cache.cached_cubin("softmax_topk", "sm_80", tmp_path).from_cache
    assert sorted(p.suffix for p in (tmp_path / "kernels").iterdir()) == [".cubin", ".cubin"]


def test_a_bad_cache_entry_is_compiled_anew(tmp_path: Path) -> None:
    good = cache.cached_cubin("nms", "sm_80", tmp_path)
    good.path.write_bytes(b"not a cubin")  # a foreign or damaged file: not an ELF image
    again = cache.cached_cubin("nms", "sm_80", tmp_path)
    assert not again.from_cache and again.cubin == good.cubin
    again.path.write_bytes(good.cubin[:100])  # truncated: the driver refuses it on a GPU
    assert cache.cached_cubin("nms", "sm_80", tmp_path).from_cache
    fresh = cache.cached_cubin("nms", "sm_80", tmp_path, refresh=True)
    assert not fresh.from_cache and fresh.cubin == good.cubin
    assert list((tmp_path / "kernels").glob("*.tmp")) == []


def test_forgetting_in_a_read_only_cache_is_not_an_error(tmp_path: Path) -> None:
    entry = cache.cached_cubin("nms", "sm_80", tmp_path)
    undeletable = replace(entry, path=Path("/proc/version"))  # unlink fails, even for root
    with pytest.raises(OSError):
        undeletable.path.unlink()
    cache.forget(undeletable)  # logged, not raised


def test_cache_key_covers_source_headers_and_arch() -> None:
    bundle = load_source("letterbox")
    key = cache.cache_key(bundle, "sm_90")
    assert cache.cache_key(bundle, "sm_90") == key
    assert cache.cache_key(bundle, "sm_80") != key
    assert cache.cache_key(replace(bundle, source=bundle.source + b" "), "sm_90") != key
    headers = tuple((name, text + b"\n") for name, text in bundle.headers)
    assert cache.cache_key(replace(bundle, headers=headers), "sm_90") != key
    assert cache.cache_key(bundle, "sm_90", (*COMPILE_OPTIONS, "-G")) != key


def test_unwritable_cache_still_compiles(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    entry = cache.cached_cubin("nms", "sm_90", blocker)
    assert not entry.from_cache and entry.cubin[:4] == b"\x7fELF"


def test_wheel_carries_the_kernel_sources(tmp_path: Path) -> None:
    require_module("setuptools")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("tensord-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (ROOT / "kernels").glob("*.cu*"):
        assert f"tensord/kernels/cuda/{path.name}" in names
