"""`tensord serve` exactly as the CLI runs it, except that a model named `faulty` runs on a
backend that meets a sticky CUDA error when its input holds -999 (zeros, as in warm-up,
run normally). The daemon's lifecycle after the error is what the e2e test checks.

python -m tests.e2e.device_lost_daemon [serve flags...]
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from cuda.bindings import runtime as cudart

from tensord import cli
from tensord.backends.base import Backend, DeviceOptions
from tensord.cuda.runtime import check
from tensord.logs import configure_logging
from tensord.modelconfig.model import ModelConfig
from tensord.registry.registry import default_backend_factory
from tensord.server.app import TensordServer
from tests.models import WrappedBackend

MARKER = -999.0


class StickyFaultBackend(WrappedBackend):
    """An ONNX Runtime backend whose run fails the way a lost CUDA context does."""

    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        if any(np.any(array == MARKER) for array in inputs.values()):
            # The checked-call path a CUDA executor takes on cudaStreamSynchronize.
            check((cudart.cudaError_t.cudaErrorIllegalAddress,), "cudaStreamSynchronize")
        return super().run(inputs, output_names)


def factory(path: Path, config: ModelConfig, where: DeviceOptions) -> Backend:
    backend = default_backend_factory(path, config, where)
    return StickyFaultBackend(backend) if path.parts[-3] == "faulty" else backend  # type: ignore[return-value]


def main(argv: list[str]) -> int:
    args = cli.build_parser().parse_args(["serve", *argv])
    config = cli._config_from(args)
    configure_logging(config.server.log_format, config.server.log_level)
    server_cls = functools.partial(TensordServer, backend_factory=factory)
    return asyncio.run(cli._serve(server_cls, config, lambda: cli._config_from(args)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
