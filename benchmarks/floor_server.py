"""The architecture's floor: a bare grpc.aio server that runs the model on a thread pool.

It is the least a grpc.aio server around the same ONNX Runtime session can do per call:
the echo server's options, event loop and GIL switch interval; the model built as the
daemon builds it (tensord's OnnxRuntimeBackend with the model's model.toml); the request
parsed by protobuf, its raw tensor read with np.frombuffer, the run handed to a pool of
`instance_count` threads with `run_in_executor`, and a PredictResponse with the output
sent back. No validation, deadlines, accounting, metrics, logging or request ids. Its rate
against the same limit shows how much of the limit grpc.aio with a thread hand-off leaves
on this host at all, and tensord's rate against its rate what the daemon itself costs.

Run as a subprocess: `python floor_server.py --listen 127.0.0.1:0 --model-repository DIR`;
it prints `LISTENING <port>` once it accepts calls and exits on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from echo_server import serve_handlers
from ort_limit import find_model
from payloads import METHOD, MODEL, OUTPUT_NAME

from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.config import ServerSettings
from tensord.eventloop import run
from tensord.v1 import inference_pb2 as pb

_FLOAT32 = np.dtype("<f4")


def _handlers(
    backend: OnnxRuntimeBackend, pool: ThreadPoolExecutor, version: int
) -> dict[str, grpc.RpcMethodHandler]:
    outputs = [OUTPUT_NAME]

    async def predict(request: pb.PredictRequest, context: Any) -> pb.PredictResponse:
        tensor = request.inputs[0]
        array = np.frombuffer(tensor.raw_data, dtype=_FLOAT32).reshape(tuple(tensor.shape))
        loop = asyncio.get_running_loop()
        (out,) = await loop.run_in_executor(pool, backend.run, {tensor.name: array}, outputs)
        reply = pb.Tensor(
            name=OUTPUT_NAME, dtype=pb.DATA_TYPE_FLOAT32, shape=out.shape, raw_data=out.tobytes()
        )
        return pb.PredictResponse(model=request.model, version=version, outputs=[reply])

    return {
        METHOD: grpc.unary_unary_rpc_method_handler(
            predict,
            request_deserializer=pb.PredictRequest.FromString,
            response_serializer=pb.PredictResponse.SerializeToString,
        )
    }


async def serve(listen: str, repository: Path, model: str = MODEL) -> None:
    """Serve `model` until SIGTERM or SIGINT; print the bound port first."""
    path, config, version = find_model(repository, model)
    backend = OnnxRuntimeBackend(path, config)
    pool = ThreadPoolExecutor(config.instance_count, thread_name_prefix="floor")
    try:
        await serve_handlers(listen, _handlers(backend, pool, version))
    finally:
        pool.shutdown()
        backend.close()


def main() -> int:
    """Parse the arguments and serve."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT; port 0 picks one")
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument(
        "--model",
        default=MODEL,
        help=f"the model served, with one float32 input and an `{OUTPUT_NAME}` ({MODEL})",
    )
    args = parser.parse_args()
    sys.setswitchinterval(ServerSettings().switch_interval_us / 1e6)
    run(serve(args.listen, args.model_repository, args.model), "auto")
    return 0


if __name__ == "__main__":
    sys.exit(main())
