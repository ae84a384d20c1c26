"""Generate the Python modules of the Open Inference Protocol (KServe v2) gRPC service
into clients/python/tensord_client/kserve/v2 (`make proto`).

The client distribution carries them, as it does tensord.v1's stubs, and the daemon
re-exports them as `tensord.kserve.v2`. The protos (protos/third_party/triton) keep
Triton's file names, so protoc writes top-level modules (`grpc_service_pb2`) that import
each other by those names; the lines that name modules are pointed at
`tensord_client.kserve.v2`. The descriptors keep the file names
`grpc_service.proto` and `model_config.proto`, as Triton and its clients register them.
tests/unit/test_kserve_contract.py checks that the modules in the tree are what this makes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{PROTOS}",
                f"--python_out={scratch}",
                f"--pyi_out={scratch}",
                f"--grpc_python_out={scratch}",
                str(PROTOS / "model_config.proto"),
                str(PROTOS / "grpc_service.proto"),
            ],
            check=True,
        )
        texts = {}
        for name, rewrites in REWRITES.items():
            text = (Path(scratch) / name).read_text()
            for old, new in rewrites:
                if text.count(old) != 1:
                    raise RuntimeError(
                        f"{name}: expected {old!r} once in protoc's output, found it "
                        f"{text.count(old)} times; update REWRITES in {Path(__file__).name}"
                    )
                text = text.replace(old, new)
            texts[name] = text
        return texts


def main() -> int:
    """Write the generated modules into the package."""
    for name, text in generate().items():
        (PACKAGE / name).write_text(text)
        print(f"wrote {(PACKAGE / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
