"""Prove that onnxruntime-gpu runs a model on the CUDA provider, or say why it does not.

    PYTHONPATH=SITE python tests/gpu/ort_gpu_check.py SITE

tests/gpu/ort-gpu-install.sh runs it on the GPU host after unpacking. It checks that
`onnxruntime` comes from SITE (not the host's own CPU build), loads the CUDA and cuDNN
libraries the way tensord does (preload_dlls), then opens a session on a small model
(MatMul on cuBLAS; Add, Relu, Softmax and ReduceSum on ONNX Runtime's own CUDA kernels)
with CUDAExecutionProvider alone and the CPU fallback disabled, runs it and compares with
NumPy. `get_available_providers()` lists CUDA in every GPU build, loadable or not, so what
counts is the session's own `get_providers()`. Exits 0 when it ran on the GPU, 1 naming
what failed.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CUDA = "CUDAExecutionProvider"
CUDA_LIBRARIES = ("cublas", "cudart", "cudnn", "curand", "cufft", "nvrtc")


def tiny_model() -> bytes:
    """y = ReduceSum(Softmax(Relu(x @ w + b)), axis 1), float32, opset 17."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["z"]),
        helper.make_node("Relu", ["z"], ["r"]),
        helper.make_node("Softmax", ["r"], ["s"], axis=-1),
        helper.make_node("ReduceSum", ["s", "axes"], ["y"], keepdims=0),
    ]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(
        nodes,
        "ort_gpu_check",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [128, 32]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [32]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32])],
        initializer=[axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime of the last years reads
    return bytes(model.SerializeToString())


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.maximum(x.astype(np.float64) @ w + b, 0.0)
    e = np.exp(r - r.max(axis=-1, keepdims=True))
    return np.asarray((e / e.sum(axis=-1, keepdims=True)).sum(axis=0), dtype=np.float32)


def loaded_cuda_libraries() -> list[str]:
    """The CUDA and cuDNN libraries mapped into this process, by path."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    paths = {line.split(maxsplit=5)[-1] for line in maps if "/" in line}
    return sorted(p for p in paths if any(f"lib{n}" in Path(p).name for n in CUDA_LIBRARIES))


def check(site: Path) -> str:
    """'' when the model ran on the CUDA provider and matched NumPy, else why not."""
    try:
        import onnxruntime as ort
    except Exception as exc:  # the pybind module or a library it needs did not load
        return f"import onnxruntime failed: {exc}"
    where = Path(ort.__file__).resolve()
    if not where.is_relative_to(site.resolve()):
        return f"onnxruntime {ort.__version__} comes from {where.parent}, not from {site}"
    print(f"onnxruntime {ort.__version__} ({ort.get_device()}) from {where.parent}")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):  # preload_dlls prints what it could not load
        ort.preload_dlls(cuda=True, cudnn=True, msvc=False)
    if said.getvalue().strip():
        print("preload_dlls: " + said.getvalue().strip().replace("\n", "\n  "))
    print("loaded:\n  " + ("\n  ".join(loaded_cuda_libraries()) or "no CUDA library"))
    return run_on_cuda(ort)


def run_on_cuda(ort: Any) -> str:
    """Open the model on the CUDA provider alone, read the provider back, run, compare;
    then once more with the CPU fallback off, so that no node was left to the CPU."""
    providers = [(CUDA, {"device_id": "0", "use_tf32": "0"})]
    started = time.perf_counter()
    try:
        session = ort.InferenceSession(tiny_model(), providers=providers)
    except Exception as exc:  # ONNX Runtime raises its own types; the message says it all
        return f"no session on {CUDA}: {exc}"
    if session.get_providers()[0] != CUDA:
        return (
            f"the session fell back to {session.get_providers()}: {CUDA} did not load "
            "(ONNX Runtime's error above says why)"
        )
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 128), dtype=np.float32)
    w = rng.standard_normal((128, 32), dtype=np.float32) / 8
    b = rng.standard_normal(32, dtype=np.float32)
    (y,) = session.run(["y"], {"x": x, "w": w, "b": b})
    seconds = time.perf_counter() - started
    expected = reference(x, w, b)
    if not np.allclose(y, expected, rtol=1e-4, atol=1e-4):
        worst = float(np.abs(y - expected).max())
        return f"{CUDA} ran but its result is off by up to {worst:.3g} from NumPy's"
    strict = ort.SessionOptions()
    strict.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        ort.InferenceSession(tiny_model(), strict, providers=providers)
    except Exception as exc:
        return f"{CUDA} loaded, but some nodes need the CPU: {exc}"
    print(f"ran on {session.get_providers()} in {seconds:.2f} s, every node on {CUDA}; "
          "matches NumPy")  # fmt: skip
    return ""


def main() -> int:
    site = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["TENSORD_ORT_GPU_SITE"])
    failure = check(site)
    if failure:
        print(f"ort-gpu-check: FAILED: {failure}", file=sys.stderr)
        return 1
    print("ort-gpu-check: onnxruntime-gpu runs on the CUDA provider")
    return 0


if __name__ == "__main__":
    sys.exit(main())
