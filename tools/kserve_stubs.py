"""Generate the Python modules of the Open Inference Protocol (KServe v2) gRPC service
into clients/python/tensord_client/kserve/v2 (`make proto`).

The client distribution carries them, as it does tensord.v1's stubs, and the daemon
re-exports them as `tensord.kserve.v2`. The protos (protos/third_party/triton) keep
Triton's file names, so protoc writes top-level modules (`grpc_service_pb2`) that import
each other by those names; the lines that name modules are pointed at
`tensord_client.kserve.v2`. The descriptors keep the file names
`grpc_service.proto` and `model_config.proto`, as Triton and its clients register them.
tests/unit/project/test_kserve_contract.py checks that the modules in the tree are what this makes.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python"))
from generate_stubs import run_protoc, write  # noqa: E402  (a script beside the client)

PROTOS = ROOT / "protos" / "third_party" / "triton"
PACKAGE = ROOT / "clients" / "python" / "tensord_client" / "kserve" / "v2"
MODULE = "tensord_client.kserve.v2"

# file -> (what protoc writes, what the package needs): each must occur exactly once.
REWRITES: dict[str, list[tuple[str, str]]] = {
    "model_config_pb2.py": [("'model_config_pb2'", f"'{MODULE}.model_config_pb2'")],
    "model_config_pb2.pyi": [],
    "grpc_service_pb2.py": [
        ("'grpc_service_pb2'", f"'{MODULE}.grpc_service_pb2'"),
        (
            "import model_config_pb2 as model__config__pb2",
            f"from {MODULE} import model_config_pb2 as model__config__pb2",
        ),
    ],
    "grpc_service_pb2.pyi": [
        (
            "import model_config_pb2 as _model_config_pb2",
            f"from {MODULE} import model_config_pb2 as _model_config_pb2",
        ),
    ],
    "grpc_service_pb2_grpc.py": [
        (
            "import grpc_service_pb2 as grpc__service__pb2",
            f"from {MODULE} import grpc_service_pb2 as grpc__service__pb2",
        ),
    ],
}


def generate() -> dict[str, str]:
    """The generated files' names and texts, as they belong in tensord_client/kserve/v2."""
    protos = [PROTOS / "model_config.proto", PROTOS / "grpc_service.proto"]
    return run_protoc(PROTOS, protos, REWRITES, Path(), __file__)


def main() -> int:
    """Write the generated modules into the package."""
    write(generate(), PACKAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
