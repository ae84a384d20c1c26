"""The wire bytes every measurement uses: one batch-1 PredictRequest and its response.

The tensord run and the echo run must move the same bytes, so both are built here once.
The load generator sends `request_bytes()` as-is, and the echo server answers with
`response_bytes()`, a PredictResponse shaped like the daemon's answer for the demo `mlp`
(one float32 [1, 10] raw tensor plus timing), so only the server-side work differs.
"""

from __future__ import annotations

import numpy as np

from tensord.server.codec import encode_tensor
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


def batch(size: int, seed: int = _SEED) -> np.ndarray:
    """A seeded float32 [size, 512] input, the same for every run of the benchmark."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((size, INPUT_FEATURES), dtype=np.float32)


def request_message() -> pb.PredictRequest:
    """A batch-1 PredictRequest for the demo `mlp`, raw little-endian tensor bytes."""
    return pb.PredictRequest(model=MODEL, inputs=[encode_tensor(INPUT_NAME, batch(1))])


def request_bytes() -> bytes:
    """The serialised request the load generator sends to both servers."""
    data: bytes = request_message().SerializeToString()
    return data


def response_bytes() -> bytes:
    """A PredictResponse of the size tensord returns for one batch-1 `mlp` call.

    The timing fields carry typical magnitudes so their varints take the same bytes.
    """
    output = np.linspace(-1.0, 1.0, OUTPUT_FEATURES, dtype=np.float32).reshape(1, -1)
    response = pb.PredictResponse(
        model=MODEL,
        version=1,
        outputs=[encode_tensor(OUTPUT_NAME, output)],
        timing=pb.Timing(queue_us=40, compute_us=500, total_us=650),
    )
    data: bytes = response.SerializeToString()
    return data
