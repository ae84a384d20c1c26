"""Generate the Python stubs of the contract into tensord_client/v1 (`make proto`).

protoc names Python modules after the .proto's path, so the stubs of
protos/tensord/v1/inference.proto come out as `tensord.v1.*`. The client distribution
carries them as `tensord_client.v1` (the daemon re-exports them as `tensord.v1`), so the two
lines that name the module are pointed there; the descriptor keeps the file name
`tensord/v1/inference.proto`, as reflection and every other language see it.
tests/unit/project/test_contract.py checks that the stubs in the tree are what this makes.
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
    return run_protoc(ROOT / "protos", [PROTO], REWRITES, Path("tensord") / "v1", __file__)


def run_protoc(
    include: Path,
    protos: list[Path],
    rewrites: dict[str, list[tuple[str, str]]],
    written_in: Path,
    script: str,
) -> dict[str, str]:
    """protoc's Python, .pyi and gRPC modules of `protos` (under `include`): each file named
    in `rewrites`, read from `written_in` below protoc's output, with each (old, new) pair
    replaced; an `old` that does not occur exactly once fails, naming `script`'s REWRITES.
    tools/kserve_stubs.py uses it too."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{include}",
                f"--python_out={scratch}",
                f"--pyi_out={scratch}",
                f"--grpc_python_out={scratch}",
                *map(str, protos),
            ],
            check=True,
        )
        texts = {}
        for name, pairs in rewrites.items():
            text = (Path(scratch) / written_in / name).read_text()
            for old, new in pairs:
                if text.count(old) != 1:
                    raise RuntimeError(
                        f"{name}: expected {old!r} once in protoc's output, found it "
                        f"{text.count(old)} times; update REWRITES in {Path(script).name}"
                    )
                text = text.replace(old, new)
            texts[name] = text
        return texts


def write(texts: dict[str, str], package: Path) -> None:
    """Write the generated files into `package`, saying each."""
    for name, text in texts.items():
        (package / name).write_text(text)
        print(f"wrote {(package / name).relative_to(ROOT)}")


def main() -> int:
    """Write the stubs into the client package."""
    write(generate(), PACKAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
