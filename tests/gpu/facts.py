"""The facts of a GPU run, as JSON: the device (nvidia-smi), the CUDA driver and runtime,
NVRTC, ONNX Runtime's providers, TensorRT, and the versions of the packages tensord uses.

    python tests/gpu/facts.py OUT.json
    python tests/gpu/facts.py --imports
    python tests/gpu/facts.py --cuda-session

Run by the GPU calls (tests/gpu/run-offline.sh, run-ort-gpu.sh). Exits 1, saying why, when
the CUDA probe sees no device, so a host that should have one never goes on to a run of
skips. With --imports it checks that every module the GPU tests and benchmarks import
loads, and that ONNX Runtime is the release pyproject.toml pins; with --cuda-session that
tensord opens a model on the CUDA provider (exit 1, saying which provider it got, if not).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGES = (
    "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime",
    "nvidia-cublas", "nvidia-cudnn-cu13", "onnxruntime", "onnxruntime-gpu", "tensorrt",
    "numpy", "onnx", "grpcio", "protobuf", "pydantic", "pytest", "tokenizers", "cupy-cuda13x",
    "torch",
)  # fmt: skip
SMI_FIELDS = (
    "name", "driver_version", "memory.total", "compute_cap", "pcie.link.gen.max",
    "pcie.link.width.max", "clocks.max.sm", "clocks.max.memory", "power.limit",
)  # fmt: skip


def nvidia_smi() -> dict[str, Any]:
    """nvidia-smi's query fields per GPU, and its whole report."""
    try:
        query = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        report = subprocess.run(
            ["nvidia-smi"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)}
    gpus = [
        dict(zip(SMI_FIELDS, (v.strip() for v in line.split(",")), strict=False))
        for line in query.splitlines()
        if line.strip()
    ]
    return {"gpus": gpus, "report": report}


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def cuda() -> dict[str, Any]:
    from tensord.devices import probe_gpus

    report = probe_gpus()
    facts: dict[str, Any] = {
        "driver": report.driver_version,
        "runtime": report.runtime_version,
        "devices": [
            {"name": g.name, "total_memory_bytes": g.total_memory_bytes} for g in report.gpus
        ],
        "unavailable_reason": report.unavailable_reason,
    }
    try:
        from tensord.kernels.compiler import nvrtc_library, nvrtc_version, supported_archs

        facts["nvrtc"] = ".".join(map(str, nvrtc_version()))
        facts["nvrtc_library"] = nvrtc_library()
        facts["nvrtc_archs"] = supported_archs()
    except Exception as exc:  # NVRTC missing is a fact to record, not a crash
        facts["nvrtc_error"] = str(exc)
    if report.gpus:
        from cuda.bindings import runtime as cudart

        err, props = cudart.cudaGetDeviceProperties(0)
        if err == cudart.cudaError_t.cudaSuccess:
            facts["compute_capability"] = f"{props.major}.{props.minor}"
            facts["multiprocessors"] = int(props.multiProcessorCount)
            facts["l2_bytes"] = int(props.l2CacheSize)
    return facts


def onnxruntime() -> dict[str, Any]:
    try:
        import onnxruntime as ort
    except Exception as exc:
        return {"error": str(exc)}
    return {
        "version": ort.__version__,
        "module": str(Path(ort.__file__).parent),
        "providers": ort.get_available_providers(),
        "device": ort.get_device(),
    }


IMPORTS = (
    "grpc", "grpc_health.v1.health", "grpc_reflection.v1alpha.reflection", "google.protobuf",
    "google.rpc.status_pb2", "pydantic", "structlog", "numpy", "onnx", "onnxruntime",
    "tokenizers", "prometheus_client", "pytest", "pytest_asyncio", "pytest_timeout", "h2",
    "cuda.bindings.runtime", "cuda.bindings.nvrtc", "tensord.server.app", "tensord_client",
)  # fmt: skip


def pinned_onnxruntime() -> str:
    """The ONNX Runtime release pyproject.toml's cpu extra pins."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    (pin,) = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["cpu"]
    return str(pin.split("==", 1)[1])


def check_imports() -> int:
    """0 when every module imports and ONNX Runtime is the pinned release, else 1."""
    import importlib

    missing = []
    for name in IMPORTS:
        try:
            importlib.import_module(name)
        except Exception as exc:
            missing.append(f"{name}: {exc}")
    if missing:
        print("cannot import:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    import google.protobuf
    import grpc
    import onnxruntime as ort

    print(f"grpcio {grpc.__version__} ({grpc.__file__}), protobuf {google.protobuf.__version__}")
    print(f"onnxruntime {ort.__version__} ({ort.__file__})")
    if ort.__version__ != pinned_onnxruntime():
        print(
            f"onnxruntime {ort.__version__} is not the pinned {pinned_onnxruntime()}: carry "
            "build/gpu-wheels (make gpu-wheels)",
            file=sys.stderr,
        )
        return 1
    return 0


def check_cuda_session() -> int:
    """0 when tensord's own loading (prepare_cuda_libraries, then OnnxRuntimeBackend with
    its provider plan) opens ort_gpu_check's model on the CUDA provider and it computes
    there, else 1: the provider the session really got is read back, not the build's list."""
    import tempfile

    import numpy as np

    from tensord.backends.onnxruntime import OnnxRuntimeBackend
    from tensord.backends.ort_session import prepare_cuda_libraries
    from tensord.modelconfig.model import ModelConfig
    from tests.gpu.ort_gpu_check import reference, tiny_model

    print(f"CUDA libraries: {prepare_cuda_libraries()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(tiny_model())
        backend = OnnxRuntimeBackend(path, ModelConfig())
        placement = backend.placement
        print(f"tensord's session runs on {placement.provider}: {placement.provider_reason}")
        if placement.provider != "CUDAExecutionProvider":
            return 1
        rng = np.random.default_rng(3)
        x = rng.standard_normal((64, 128), dtype=np.float32)
        w = rng.standard_normal((128, 32), dtype=np.float32) / 8
        b = rng.standard_normal(32, dtype=np.float32)
        (y,) = backend.run({"x": x, "w": w, "b": b}, ["y"])
        backend.close()
    error = float(np.abs(y - reference(x, w, b)).max())
    print(f"the model on the CUDA provider (TF32 off): max abs error {error:.2e}")
    return 0 if error < 1e-4 else 1


def main() -> int:
    if sys.argv[1:] == ["--imports"]:
        return check_imports()
    if sys.argv[1:] == ["--cuda-session"]:
        return check_cuda_session()
    out = Path(sys.argv[1])
    from tensord.backends.tensorrt import tensorrt_status

    trt_ok, trt_why = tensorrt_status()
    facts = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "nvidia_smi": nvidia_smi(),
        "cuda": cuda(),
        "onnxruntime": onnxruntime(),
        "tensorrt": {"available": trt_ok, "status": trt_why},
        "packages": versions(),
    }
    out.write_text(json.dumps(facts, indent=2))
    gpus = facts["nvidia_smi"].get("gpus", [])
    device = gpus[0] if gpus else {}
    print(
        f"device: {device.get('name', '?')}, driver {device.get('driver_version', '?')}, "
        f"CUDA driver {facts['cuda']['driver'] or '?'} / runtime {facts['cuda']['runtime'] or '?'}"
        f", NVRTC {facts['cuda'].get('nvrtc', facts['cuda'].get('nvrtc_error'))}"
    )
    print(
        f"python {facts['python']}; onnxruntime {facts['onnxruntime'].get('version')} "
        f"{facts['onnxruntime'].get('providers')}; {trt_why}"
    )
    if not facts["cuda"]["devices"]:
        print(f"no CUDA device: {facts['cuda']['unavailable_reason']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
