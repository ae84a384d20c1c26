"""The GPU tier's own plumbing, checked on any host: its tests import what they use (and
no more), its kernels build as CUBINs, the CUDA dependency is the bindings themselves, and
TENSORD_REQUIRE_GPU turns a skipped GPU test into a failure that says what the probe saw."""

from __future__ import annotations

import os
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
    for name in ("cpu", "gpu"):
        assert "cuda-bindings>=13,<14" in extras[name]
        assert not [d for d in extras[name] if d.startswith(("cuda-python", "cuda-core"))]
