"""Small ONNX models the tests build themselves (onnx + NumPy, seeded, no downloads)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tensord.backends.base import Backend
from tensord.demo.repository import IR_VERSION, OPSET, build_demo_repository

# Every dtype the contract carries, with the ONNX type that holds it.
IDENTITY_DTYPES: dict[str, int] = {
    "bool": TensorProto.BOOL,
    "uint8": TensorProto.UINT8,
    "int8": TensorProto.INT8,
    "int16": TensorProto.INT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "string": TensorProto.STRING,
}


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def build_identity(path: Path, elem_type: int) -> Path:
    """y = x for a [batch, 4] tensor of one element type."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", elem_type, ["batch", 4])],
        [helper.make_tensor_value_info("y", elem_type, ["batch", 4])],
    )
    return _save(graph, path)


def build_slow(path: Path, layers: int = 96, width: int = 1024) -> Path:
    """x [batch, 1024] through `layers` MatMul+Tanh sharing one weight: cost grows with batch."""
    rng = np.random.default_rng(7)
    weight = (rng.normal(0, 1 / np.sqrt(width), (width, width))).astype(np.float32)
    nodes, current = [], "x"
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [current, "w"], [f"m{i}"]))
        out = "y" if i == layers - 1 else f"t{i}"
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [numpy_helper.from_array(weight, "w")],
    )
    return _save(graph, path)


def build_two_outputs(path: Path) -> Path:
    """a, b float32 [batch, 3] -> sum = a + b, product = a * b (for output subsets)."""
    spec = ["batch", 3]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Mul", ["a", "b"], ["product"]),
        ],
        "two_outputs",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, spec) for n in ("a", "b")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, spec) for n in ("sum", "product")],
    )
    return _save(graph, path)


DETECTOR_BOXES = np.array(
    [[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10]], dtype=np.float32
)
DETECTOR_SCORES = np.array([[0.9, 0.1], [0.8, 0.7], [0.3, 0.2], [0.9, 0.05]], dtype=np.float32)
SMALL_GENERATOR_TOML = """\
[generator]
block_size = 16
num_blocks = 160
max_num_seqs = 16
max_num_batched_tokens = 256
max_queue_size = 64
"""
"""A demo generator's model.toml with a small KV pool (160 blocks: one 2,048-token
sequence and some): cheap to load in the grpc tests."""


def small_generator(demo_repo: Path, root: Path, name: str = "tinylm", extra: str = "") -> Path:
    """The demo `tinylm` copied into `root` as `name` with SMALL_GENERATOR_TOML (and
    `extra` lines); returns `root`."""
    shutil.copytree(demo_repo / "tinylm", root / name)
    (root / name / "model.toml").write_text(SMALL_GENERATOR_TOML + extra)
    return root


DETECTOR_TOML = """max_batch_size = 8

[preprocess]
kind = "letterbox"
name = "image"
std = [255, 255, 255]
max_image_size = 512

[postprocess]
kind = "nms"
score_threshold = 0.15
iou_threshold = 0.5
max_detections = 5
"""


def build_detector(path: Path) -> Path:
    """pixels float32 [batch, 3, 64, 64] -> boxes [batch, 4, 4] and scores [batch, 4, 2]
    (fixed values whose NMS result is known by hand), and input_echo (the pixels)."""
    zero = helper.make_node("ReduceMean", ["pixels"], ["mean"], axes=[1, 2, 3], keepdims=0)
    nodes = [
        zero,
        helper.make_node("Mul", ["mean", "zero"], ["nothing"]),
        helper.make_node("Unsqueeze", ["nothing", "axes12"], ["nothing3"]),
        helper.make_node("Add", ["nothing3", "box_values"], ["boxes"]),
        helper.make_node("Add", ["nothing3", "score_values"], ["scores"]),
        helper.make_node("Identity", ["pixels"], ["input_echo"]),
    ]
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", 4, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4, 2]),
            helper.make_tensor_value_info("input_echo", TensorProto.FLOAT, ["batch", 3, 64, 64]),
        ],
        [
            numpy_helper.from_array(np.array(0, np.float32), "zero"),
            numpy_helper.from_array(np.array([1, 2], np.int64), "axes12"),
            numpy_helper.from_array(DETECTOR_BOXES[None], "box_values"),
            numpy_helper.from_array(DETECTOR_SCORES[None], "score_values"),
        ],
    )
    return _save(graph, path)


def build_test_repository(root: Path) -> Path:
    """The demo models plus identity models, a slow model, two-output model, a corrupt one."""
    build_demo_repository(root)
    for name, elem in IDENTITY_DTYPES.items():
        build_identity(root / f"identity_{name}" / "1" / "model.onnx", elem)
        (root / f"identity_{name}" / "model.toml").write_text("max_batch_size = 64\n")
    build_slow(root / "slow" / "1" / "model.onnx")
    (root / "slow" / "model.toml").write_text("max_batch_size = 4096\ninstance_count = 1\n")
    build_two_outputs(root / "two_outputs" / "1" / "model.onnx")
    (root / "two_outputs" / "model.toml").write_text("max_batch_size = 8\n")
    # Two versions of one model: version 2 doubles, version 1 is the identity.
    build_identity(root / "versioned" / "1" / "model.onnx", TensorProto.FLOAT)
    _build_double(root / "versioned" / "2" / "model.onnx")
    # The demo models again, with dynamic batching on.
    for name, delay_us, preferred in (("mlp", 2000, [16, 32]), ("cnn", 2000, [8])):
        batched = root / f"{name}_batched"
        (batched / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(root / name / "1" / "model.onnx", batched / "1" / "model.onnx")
        (batched / "model.toml").write_text(
            f"max_batch_size = 32\n[dynamic_batching]\nmax_queue_delay_microseconds = {delay_us}\n"
            f"preferred_batch_size = {preferred}\n"
        )
    # The image classifier with dynamic batching: only requests of one image size join.
    batched = root / "classifier_batched"
    shutil.copytree(root / "classifier" / "1", batched / "1", dirs_exist_ok=True)
    toml = (root / "classifier" / "model.toml").read_text()
    (batched / "model.toml").write_text(
        toml.replace("max_batch_size = 64\n", "max_batch_size = 64\n[dynamic_batching]\n"
                     "max_queue_delay_microseconds = 20000\n", 1)
    )  # fmt: skip
    build_detector(root / "detector" / "1" / "model.onnx")
    (root / "detector" / "model.toml").write_text(DETECTOR_TOML)
    broken = root / "broken" / "1" / "model.onnx"
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_bytes(b"this is not an ONNX file")
    return root


def _build_double(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    return _save(graph, path)


class WrappedBackend:
    """A real backend that a test subclass intercepts in `run` (to inject a fault, or to
    record what it is given); signature, placement and close are the inner backend's."""

    def __init__(self, inner: Backend) -> None:
        self._inner = inner
        self.inputs, self.outputs, self.placement = inner.inputs, inner.outputs, inner.placement

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        return self._inner.run(inputs, output_names)

    def terminate_runs(self) -> None:
        self._inner.terminate_runs()

    def close(self) -> None:
        self._inner.close()
