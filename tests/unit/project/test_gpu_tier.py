"""The GPU tier's own plumbing, checked on any host: its tests import what they use (and
no more), its kernels build as CUBINs, the CUDA dependency is the bindings themselves, and
TENSORD_REQUIRE_GPU turns a skipped GPU test into a failure that says what the probe saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensord.devices import probe_gpus

ROOT = Path(__file__).resolve().parents[3]


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


def test_call_two_fits_its_450_seconds() -> None:
    """GPU call 2's caps, with the set-up steps of steps.sh at their defaults, add up to
    at most its deadline, which leaves 30 s of its 480 s timeout for the transfers; call
    3's steps (the same script) fit its 180 s."""
    import re

    script = (ROOT / "tests/gpu/run-ort-gpu.sh").read_text()
    caps = {name: int(value) for name, value in re.findall(r"\bCAP_(\w+)=(\d+)", script)}
    shared = (ROOT / "tests/gpu/steps.sh").read_text()
    defaults = [int(v) for v in re.findall(r"\$\{CAP_(?:VISIBLE|WHEELS):-(\d+)\}", shared)]
    (deadline,) = re.findall(
        r"^DEADLINE=\$\(\(STARTED \+ \$\{TENSORD_GPU_CALL_SECONDS:-(\d+)\}\)\)$", script, re.M
    )
    call3 = {name: caps.pop(name) for name in ("SLOTS", "GENERATE")}
    assert len(caps) == 5 and len(defaults) == 2
    assert sum(caps.values()) + sum(defaults) <= int(deadline) <= 450, caps
    # Call 3 (the fp16 builder folder's steps alone) runs under TENSORD_GPU_CALL_SECONDS=180
    # on the warm machine: its two steps and the GPU check fit.
    assert sum(call3.values()) + defaults[0] <= 180, call3


@pytest.mark.parametrize("call", ["run-offline.sh", "run-ort-gpu.sh"])
def test_the_gpu_calls_fail_at_once_without_a_gpu(tmp_path: Path, call: str) -> None:
    """Each GPU call on a host without a GPU: exit 2 at once, the reason, and a FAIL
    verdict in summary.json; nothing is measured."""
    if probe_gpus().gpus:
        pytest.skip("a CUDA device is visible here: the call would run for real")
    done = subprocess.run(
        ["bash", f"tests/gpu/{call}", str(tmp_path)],
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
