"""The wire bytes every measurement uses: one batch-1 PredictRequest and its response.

The tensord run and the echo run must move the same bytes, so both are built here once.
The load generator sends `request_bytes()` as-is, and the echo server answers with
`response_bytes()`, a PredictResponse shaped like the daemon's answer for the demo `mlp`
(one float32 [1, 10] raw tensor plus timing), so only the server-side work differs.
Another model's request and reply (frontends_bench.py's null model) take its name and
feature count.
"""

from __future__ import annotations

import numpy as np

from tensord.server.tensord_v1.codec import encode_tensor
from tensord.v1 import inference_pb2 as pb

MODEL = "mlp"
INPUT_NAME = "input"
OUTPUT_NAME = "output"
INPUT_FEATURES = 512
OUTPUT_FEATURES = 10
SERVICE = "tensord.v1.InferenceService"
METHOD = "Predict"
PREDICT_PATH = f"/{SERVICE}/{METHOD}"
_SEED = 1234


def batch(size: int, seed: int = _SEED, features: int = INPUT_FEATURES) -> np.ndarray:
    """A seeded float32 [size, features] input, the same for every run of the benchmark."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((size, features), dtype=np.float32)


def request_message(model: str = MODEL, features: int = INPUT_FEATURES) -> pb.PredictRequest:
    """A batch-1 PredictRequest (the demo `mlp`'s unless told), raw little-endian bytes."""
    return pb.PredictRequest(
        model=model, inputs=[encode_tensor(INPUT_NAME, batch(1, features=features))]
    )


def request_bytes(model: str = MODEL, features: int = INPUT_FEATURES) -> bytes:
    """The serialised request the load generator sends to every server."""
    data: bytes = request_message(model, features).SerializeToString()
    return data


def response_bytes(model: str = MODEL, features: int = OUTPUT_FEATURES) -> bytes:
    """A PredictResponse of the size tensord returns for one batch-1 call of `model`
    whose output has `features` float32 values (the demo `mlp` unless told).

    The timing fields carry typical magnitudes so their varints take the same bytes.
    """
    output = np.linspace(-1.0, 1.0, features, dtype=np.float32).reshape(1, -1)
    response = pb.PredictResponse(
        model=model,
        version=1,
        outputs=[encode_tensor(OUTPUT_NAME, output)],
        timing=pb.Timing(queue_us=40, compute_us=500, total_us=650),
    )
    data: bytes = response.SerializeToString()
    return data
