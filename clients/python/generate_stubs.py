"""Generate the Python stubs of the contract into tensord_client/v1 (`make proto`).

protoc names Python modules after the .proto's path, so the stubs of
protos/tensord/v1/inference.proto come out as `tensord.v1.*`. The client distribution
carries them as `tensord_client.v1` (the daemon re-exports them as `tensord.v1`), so the two
lines that name the module are pointed there; the descriptor keeps the file name
`tensord/v1/inference.proto`, as reflection and every other language see it.
tests/unit/test_contract.py checks that the stubs in the tree are what this makes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROTO = ROOT / "protos" / "tensord" / "v1" / "inference.proto"
PACKAGE = HERE / "tensord_client" / "v1"

# file -> (what protoc writes, what the client package needs): each must occur exactly once.
REWRITES: dict[str, list[tuple[str, str]]] = {
    "inference_pb2.py": [("'tensord.v1.inference_pb2'", "'tensord_client.v1.inference_pb2'")],
    "inference_pb2.pyi": [],
    "inference_pb2_grpc.py": [
        ("from tensord.v1 import inference_pb2", "from tensord_client.v1 import inference_pb2"),
        ("generated code in tensord/v1/", "generated code in tensord_client/v1/"),
    ],
}


def generate() -> dict[str, str]:
    """The stub files' names and texts, as they belong in tensord_client/v1."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{ROOT / 'protos'}",
                f"--python_out={scratch}",
                f"--pyi_out={scratch}",
                f"--grpc_python_out={scratch}",
                str(PROTO),
            ],
            check=True,
        )
        texts = {}
        for name, rewrites in REWRITES.items():
            text = (Path(scratch) / "tensord" / "v1" / name).read_text()
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
    """Write the stubs into the client package."""
    for name, text in generate().items():
        (PACKAGE / name).write_text(text)
        print(f"wrote {(PACKAGE / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
