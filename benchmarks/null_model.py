"""A model that answers in microseconds, so that a server's own cost is what is measured.

`null` is one ONNX `Add` of a constant 1.0 to a float32 [batch, 16] input (opset and IR
version as the demo models), served by ONNX Runtime as any model is: a batch-1 run costs
about 4 µs in-process on the 2-core VM (`python benchmarks/null_model.py --measure`), far
below the server's per-call work. `null_batched` is the same file with `[dynamic_batching]`
on, as an operator declares it in model.toml.

    python benchmarks/null_model.py DIR            # write DIR/null and DIR/null_batched
    python benchmarks/null_model.py DIR --measure  # and time ONNX Runtime on it in-process
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tensord.demo.repository import IR_VERSION, OPSET

NULL = "null"
NULL_BATCHED = "null_batched"
FEATURES = 16
MAX_BATCH_SIZE = 128


def build_null() -> onnx.ModelProto:
    """output = input + 1, float32 [batch, FEATURES]."""
    one = numpy_helper.from_array(np.ones(FEATURES, dtype=np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["input", "one"], ["output"], name="add")],
        NULL,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", FEATURES])],
        [one],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensord-bench"
    )
    model.ir_version = IR_VERSION
    model.doc_string = "tensord benchmark null model: output = input + 1"
    onnx.checker.check_model(model)
    return model


def model_tomls(batch_delay_us: int) -> dict[str, str]:
    """model.toml of each null model: the unbatched one as the demo mlp is declared, the
    batched one with [dynamic_batching] (one batch at a time on the CPU executor)."""
    return {
        NULL: f"max_batch_size = {MAX_BATCH_SIZE}\n",
        NULL_BATCHED: (
            f"max_batch_size = {MAX_BATCH_SIZE}\n\n[dynamic_batching]\n"
            f"max_queue_delay_microseconds = {batch_delay_us}\n"
        ),
    }


def build_null_repository(root: Path, batch_delay_us: int = 0) -> Path:
    """Write root/null and root/null_batched (version 1 each); returns root."""
    model = build_null()
    for name, toml in model_tomls(batch_delay_us).items():
        path = root / name / "1" / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
        (root / name / "model.toml").write_text(f"# Benchmark null model.\n{toml}")
    return root


def measure_in_process(root: Path, runs: int = 20_000) -> dict[str, Any]:
    """µs per `run` of tensord's OnnxRuntimeBackend over `null` at batch 1 and 64, one
    thread, back to back after 2,000 warm-up runs."""
    from tensord.backends.onnxruntime import OnnxRuntimeBackend
    from tensord.modelconfig.model import read_model_config

    config = read_model_config(root / NULL)
    backend = OnnxRuntimeBackend(root / NULL / "1" / "model.onnx", config)
    report: dict[str, Any] = {"runs": runs}
    try:
        for size in (1, 64):
            feeds = {"input": np.zeros((size, FEATURES), dtype=np.float32)}
            for _ in range(2_000):
                backend.run(feeds, ["output"])
            start = time.perf_counter()
            for _ in range(runs):
                backend.run(feeds, ["output"])
            report[f"batch{size}_us"] = (time.perf_counter() - start) / runs * 1e6
    finally:
        backend.close()
    return report


def main() -> int:
    """Write the repository; with --measure, print ONNX Runtime's cost as one JSON line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("root", type=Path, help="repository directory to write into")
    parser.add_argument(
        "--batch-delay-us",
        type=int,
        default=0,
        help="null_batched's max_queue_delay_microseconds (0)",
    )
    parser.add_argument("--measure", action="store_true", help="time ONNX Runtime on `null`")
    args = parser.parse_args()
    build_null_repository(args.root, args.batch_delay_us)
    if args.measure:
        print(json.dumps(measure_in_process(args.root)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
