"""The GPU tier's own plumbing, checked on any host: its tests import what they use (and
no more), its kernels build as CUBINs, the CUDA dependency is the bindings themselves, and
TENSORD_REQUIRE_GPU turns a skipped GPU test into a failure that says what the probe saw."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tensord.devices import probe_gpus

ROOT = Path(__file__).resolve().parents[2]


def test_the_kernel_tests_use_the_nms_twin_not_the_package_name() -> None:
    """tensord.kernels re-exports the function nms over its submodule of that name."""
    from tensord.kernels.nms import nms
    from tests.gpu import test_kernels

    assert test_kernels.nms_twin is nms


def test_require_gpu_fails_instead_of_skipping() -> None:
    report = probe_gpus()
    if report.gpus:
        pytest.skip("a CUDA device is visible here: the GPU tests run for real")
    env = {**os.environ, "TENSORD_REQUIRE_GPU": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/gpu/test_sticky_error.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:]
    assert "TENSORD_REQUIRE_GPU=1, but no CUDA device: " in done.stdout
    assert report.unavailable_reason in done.stdout


def test_the_test_and_benchmark_kernels_build_as_cubins_for_hopper() -> None:
    """The sticky-error test's kernel and the kernel backend's (the executor's GPU tests and
    gpu_bench) compile to CUBINs (no PTX for a driver to refuse), like the production
    kernels; NVRTC needs no GPU."""
    from tensord.kernels.compiler import arch_for, compile_source, supported_archs
    from tests.gpu.illegal_address import KERNEL
    from tests.tools import require_module

    require_module("cuda.bindings.nvrtc")
    if 90 not in supported_archs():
        pytest.fail(f"this NVRTC does not build sm_90: {supported_archs()}")
    from tests.gpu.kernel_backend import SOURCE

    for source, name, options in ((KERNEL, "poke.cu", ()), (SOURCE, "affine_spin.cu", None)):
        arch = arch_for(9, 0)
        compiled = compile_source(source, name, arch, *(() if options is None else (options,)))
        assert compiled.cubin[:4] == b"\x7fELF", name


def test_the_root_conftest_imports_nothing_of_the_serving_stack() -> None:
    """Kernel-only GPU tests must not need grpc, pydantic or onnxruntime to be collected."""
    code = (
        "import sys, tests.conftest, tests.gpu.conftest, tests.gpu.test_kernels\n"
        "heavy = {'grpc', 'pydantic', 'onnxruntime', 'tensord.server.app', 'structlog'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_cuda_dependency_is_cuda_bindings_not_the_meta_package() -> None:
    """cuda-python pins one exact cuda-bindings (and cuda-core): an offline host with
    another 13.x could not install tensord."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for name in ("gpu", "dev"):  # serving on a GPU; the tests compile kernels anywhere
        assert "cuda-bindings>=13,<14" in extras[name]
    for deps in extras.values():
        assert not [d for d in deps if d.startswith(("cuda-python", "cuda-core"))]
    assert extras["cpu"] == ["onnxruntime==1.31.1"]  # serving on the CPU needs no CUDA


def test_onnx_runtime_is_one_pinned_release_everywhere() -> None:
    """CI, the CPU and GPU extras and both GPU calls run one ONNX Runtime: the CPU wheel
    call 1 carries and the onnxruntime-gpu call 2 repacks are the Makefile's ORT_VERSION,
    and the GPU wheel is a CUDA 13 build (1.31.1 is) for the host's driver."""
    import re
    import tomllib

    import onnxruntime

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (version,) = re.findall(r"^ORT_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert f"onnxruntime=={version}" in extras["cpu"]
    assert f"onnxruntime-gpu=={version}" in extras["gpu"]
    assert onnxruntime.__version__ == version  # what make test installed


def test_call_one_fits_its_330_seconds() -> None:
    """GPU call 1's step caps add up to at most 330 s, its whole deadline."""
    import re

    script = (ROOT / "tests/gpu/run-offline.sh").read_text()
    caps = {name: int(value) for name, value in re.findall(r"\bCAP_(\w+)=(\d+)", script)}
    assert set(caps) == {"VISIBLE", "WHEELS", "IMPORTS", "FACTS", "TESTS", "KERNELS", "GPU"}
    (deadline,) = re.findall(r"^CALL1_SECONDS=(\d+)$", script, re.M)
    assert sum(caps.values()) <= int(deadline) <= 330, caps


def test_the_offline_run_fails_loudly_without_a_gpu(tmp_path: Path) -> None:
    """tests/gpu/run-offline.sh on a host without a GPU: a non-zero exit, the reason, and a
    FAIL verdict in summary.json; nothing is measured."""
    if probe_gpus().gpus:
        pytest.skip("a CUDA device is visible here: the offline run would run for real")
    done = subprocess.run(
        ["bash", "tests/gpu/run-offline.sh", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHON": sys.executable}, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert "verdict: FAIL" in said
    assert ("nvidia-smi is not on the PATH" in said) or ("no CUDA device: " in said), said
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] is False and summary["steps"][-1]["rc"] != 0
    assert not (tmp_path / "gpu-tests.xml").exists()


def fake_wheel(folder: Path) -> Path:
    """A real (tiny) wheel of a package named onnxruntime, as pip installs it."""
    import base64
    import hashlib
    import zipfile

    files = {
        "onnxruntime/__init__.py": (
            "__version__ = '0.0.1'\n"
            "def preload_dlls():\n    pass\n"
            "def get_available_providers():\n    return ['CUDAExecutionProvider']\n"
            + "# padding\n"
            * 3000
        ).encode(),
        "onnxruntime_gpu-0.0.1.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 0.0.1\n"
        ),
        "onnxruntime_gpu-0.0.1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("onnxruntime_gpu-0.0.1.dist-info/RECORD,,")
    files["onnxruntime_gpu-0.0.1.dist-info/RECORD"] = "\n".join(record).encode() + b"\n"
    wheel = folder / "onnxruntime_gpu-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def test_onnxruntime_gpu_travels_in_checked_parts(tmp_path: Path) -> None:
    """The parts arrive over several transfers; each is checked, the joined wheel too, and
    it installs where the offline run looks for it."""
    wheel = fake_wheel(tmp_path)
    parts, dest = tmp_path / "parts", tmp_path / "dest"
    split = subprocess.run(
        ["bash", "tests/gpu/ort-gpu-parts.sh", str(wheel), str(parts), "12k"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    pieces = sorted(parts.glob("*.part-*"))
    assert len(pieces) >= 3, split.stdout
    sums = (parts / "SHA256SUMS").read_text()
    assert all(p.name in sums for p in pieces) and wheel.name in sums

    def install(*names: str) -> subprocess.CompletedProcess[str]:
        carried = tmp_path / "carried"
        if carried.exists():
            shutil.rmtree(carried)
        carried.mkdir()
        shutil.copy(parts / "SHA256SUMS", carried)
        for name in names:
            shutil.copy(parts / name, carried)
        env = {**os.environ, "TENSORD_ORT_GPU_DIR": str(dest), "PYTHON": sys.executable}
        return subprocess.run(
            ["bash", "tests/gpu/ort-gpu-install.sh", str(carried)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    first = install(pieces[0].name)
    assert first.returncode == 3 and "parts still missing" in first.stdout, first.stderr
    corrupt = parts / pieces[1].name
    good = corrupt.read_bytes()
    corrupt.write_bytes(b"x" + good[1:])
    bad = install(pieces[1].name)
    assert bad.returncode == 1 and "not kept" in bad.stderr
    corrupt.write_bytes(good)
    done = install(*(p.name for p in pieces[1:]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "onnxruntime 0.0.1 ['CUDAExecutionProvider']" in done.stdout
    assert (dest / "site" / "onnxruntime" / "__init__.py").exists()
