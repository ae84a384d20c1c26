"""The embedded demo model repository, built with onnx and NumPy only (seeded, no downloads).

mlp   input  float32 [-1, 512] -> 1024 -> 1024 -> 1024 (Gemm+Relu) -> Gemm -> output [-1, 10]
cnn   image  uint8 [-1, 3, 32, 32] (NCHW) -> /255 -> conv-relu-pool x2 -> Gemm -> softmax
      -> probabilities float32 [-1, 10]
classifier  pixels float32 [-1, 3, 32, 32] (normalised NCHW) -> conv-relu-pool x2 -> Gemm
      -> logits [-1, 10]; its model.toml serves it as uint8 HWC images of any size in
      (resized and normalised by [preprocess]) and the top 3 classes out ([postprocess])
tinylm  a Llama-style decoder that streams tokens (tensord.demo.generator), in Hugging
      Face Optimum's layout and with no model.toml: served as it is
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tensord.demo.generator import DEMO_GENERATOR, build_demo_generator

OPSET = 17
IR_VERSION = 9  # read by every ONNX Runtime release tensord supports


_Value = tuple[str, int, Sequence[str | int]]
"""A graph input or output: name, element type (TensorProto), dimensions."""


def _init(
    rng: np.random.Generator, name: str, shape: tuple[int, ...], fan_in: int
) -> onnx.TensorProto:
    weights = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape).astype(np.float32)
    return numpy_helper.from_array(weights, name)


def _model(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: Sequence[_Value],
    outputs: Sequence[_Value],
    inits: list[onnx.TensorProto],
    doc: str,
) -> onnx.ModelProto:
    """A demo model: its graph of `nodes`, (name, element type, dims) inputs and outputs."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(*value) for value in inputs],
        [helper.make_tensor_value_info(*value) for value in outputs],
        inits,
    )
    return _finish(graph, doc)


def _finish(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensord-demo"
    )
    model.ir_version = IR_VERSION
    model.doc_string = doc
    onnx.checker.check_model(model)
    return model


def build_mlp(seed: int = 0) -> onnx.ModelProto:
    """512 -> 1024 -> 1024 -> 1024 -> 10, Gemm+Relu per hidden layer."""
    rng = np.random.default_rng(seed)
    sizes = [512, 1024, 1024, 1024, 10]
    nodes, inits = [], []
    current = "input"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        inits += [
            _init(rng, f"w{i}", (n_in, n_out), n_in),
            numpy_helper.from_array((rng.normal(0, 0.01, n_out)).astype(np.float32), f"b{i}"),
        ]
        last = i == len(sizes) - 2
        out = "output" if last else f"h{i}"
        gemm_out = out if last else f"g{i}"
        nodes.append(
            helper.make_node("Gemm", [current, f"w{i}", f"b{i}"], [gemm_out], name=f"gemm{i}")
        )
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [out], name=f"relu{i}"))
        current = out
    inputs: list[_Value] = [("input", TensorProto.FLOAT, ["batch", 512])]
    outputs: list[_Value] = [("output", TensorProto.FLOAT, ["batch", 10])]
    return _model(
        "mlp", nodes, inputs, outputs, inits, "tensord demo MLP: 512 -> 1024 -> 1024 -> 1024 -> 10"
    )


def build_cnn(seed: int = 1) -> onnx.ModelProto:
    """A small image classifier over uint8 NCHW 3x32x32 images."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(np.array(1.0 / 255.0, dtype=np.float32), "scale"),
        _init(rng, "c1_w", (8, 3, 3, 3), 27),
        numpy_helper.from_array(np.zeros(8, np.float32), "c1_b"),
        _init(rng, "c2_w", (16, 8, 3, 3), 72),
        numpy_helper.from_array(np.zeros(16, np.float32), "c2_b"),
        _init(rng, "fc_w", (16 * 8 * 8, 10), 16 * 8 * 8),
        numpy_helper.from_array(np.zeros(10, np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Cast", ["image"], ["imagef"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["imagef", "scale"], ["x0"]),
        *_conv_trunk("x0"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    inputs: list[_Value] = [("image", TensorProto.UINT8, ["batch", 3, 32, 32])]
    outputs: list[_Value] = [("probabilities", TensorProto.FLOAT, ["batch", 10])]
    return _model(
        "cnn",
        nodes,
        inputs,
        outputs,
        inits,
        "tensord demo CNN: uint8 NCHW 3x32x32 images -> 10 class probabilities",
    )


def _conv_trunk(source: str) -> list[onnx.NodeProto]:
    """conv-relu-pool x2 -> flatten -> Gemm, from float NCHW 3x32x32 `source` to "logits"
    (weights c1_w, c1_b, c2_w, c2_b, fc_w, fc_b)."""
    conv: dict[str, Any] = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    pool: dict[str, Any] = {"kernel_shape": [2, 2], "strides": [2, 2]}
    return [
        helper.make_node("Conv", [source, "c1_w", "c1_b"], ["x1"], **conv),
        helper.make_node("Relu", ["x1"], ["x2"]),
        helper.make_node("MaxPool", ["x2"], ["x3"], **pool),
        helper.make_node("Conv", ["x3", "c2_w", "c2_b"], ["x4"], **conv),
        helper.make_node("Relu", ["x4"], ["x5"]),
        helper.make_node("MaxPool", ["x5"], ["x6"], **pool),
        helper.make_node("Flatten", ["x6"], ["x7"], axis=1),
        helper.make_node("Gemm", ["x7", "fc_w", "fc_b"], ["logits"]),
    ]


def build_classifier(seed: int = 2) -> onnx.ModelProto:
    """A small classifier over normalised float32 NCHW 3x32x32 images, returning logits."""
    rng = np.random.default_rng(seed)
    inits = [
        _init(rng, "c1_w", (8, 3, 3, 3), 27),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "c1_b"),
        _init(rng, "c2_w", (16, 8, 3, 3), 72),
        numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "c2_b"),
        _init(rng, "fc_w", (16 * 8 * 8, 10), 16 * 8 * 8),
        numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "fc_b"),
    ]
    nodes = _conv_trunk("pixels")
    inputs: list[_Value] = [("pixels", TensorProto.FLOAT, ["batch", 3, 32, 32])]
    outputs: list[_Value] = [("logits", TensorProto.FLOAT, ["batch", 10])]
    return _model(
        "classifier",
        nodes,
        inputs,
        outputs,
        inits,
        "tensord demo classifier: normalised NCHW 3x32x32 -> 10 logits",
    )


_MODEL_TOML = {
    "mlp": "max_batch_size = 128\n",
    "cnn": "max_batch_size = 64\n",
    "classifier": """max_batch_size = 64

# Predict takes uint8 HWC RGB images of any size as "image" [N, H, W, 3]: they are resized
# to the model's 32x32 (bilinear, half-pixel centres) and normalised with ImageNet's mean
# and std, on the GPU when the model runs there, else with the NumPy twins.
[preprocess]
kind = "resize"
name = "image"
mean = [123.675, 116.28, 103.53]
std = [58.395, 57.12, 57.375]

# Predict returns "classes" int32 [N, 3] and "scores" float32 [N, 3] (softmax
# probabilities) instead of the logits.
[postprocess]
kind = "topk"
k = 3
""",
}


def build_demo_repository(root: Path, *, force: bool = False) -> list[Path]:
    """Write mlp/, cnn/, classifier/ (version 1 each) and tinylm/ under `root`; skip models
    that exist unless forced."""
    written = []
    for name, build in (("mlp", build_mlp), ("cnn", build_cnn), ("classifier", build_classifier)):
        model_dir = root / name
        path = model_dir / "1" / "model.onnx"
        if path.exists() and not force:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(build(), str(path))
        (model_dir / "model.toml").write_text(
            f"# Demo model built by `tensord demo-repo`.\n{_MODEL_TOML[name]}"
        )
        written.append(path)
    generator = root / DEMO_GENERATOR
    if force or not (generator / "model.onnx").exists():
        build_demo_generator(generator)
        written.append(generator / "model.onnx")
    return written
