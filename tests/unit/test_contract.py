"""The contract: generated stubs match the .proto, buf lint passes, every element is commented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from tests.tools import buf, require_module

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "protos" / "tensord" / "v1" / "inference.proto"
GENERATED = ROOT / "daemon" / "tensord" / "v1"


def test_generated_code_is_current(tmp_path: Path) -> None:
    require_module("grpc_tools")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(PROTO),
        ],
        check=True,
    )
    for name in ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py"):
        fresh = (tmp_path / "tensord" / "v1" / name).read_text()
        assert (GENERATED / name).read_text() == fresh, f"{name} is stale: run `make proto`"


def test_buf_lint() -> None:
    result = subprocess.run(
        [str(buf()), "lint"], cwd=ROOT / "protos", capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_message_field_and_enum_value_is_commented() -> None:
    require_module("grpc_tools")
    from grpc_tools import protoc

    out = ROOT / "build" / "inference.pb"
    out.parent.mkdir(exist_ok=True)
    assert (
        protoc.main(
            [
                "protoc",
                f"-I{ROOT / 'protos'}",
                "--include_source_info",
                f"--descriptor_set_out={out}",
                str(PROTO),
            ]
        )
        == 0
    )
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    locations = fds.file[0].source_code_info.location
    commented = {tuple(loc.path) for loc in locations if loc.leading_comments.strip()}
    f = fds.file[0]
    missing = []
    for i, msg in enumerate(f.message_type):
        if (4, i) not in commented:
            missing.append(msg.name)
        missing += [
            f"{msg.name}.{fld.name}"
            for j, fld in enumerate(msg.field)
            if (4, i, 2, j) not in commented
        ]
    for i, enum in enumerate(f.enum_type):
        if (5, i) not in commented:
            missing.append(enum.name)
        missing += [v.name for j, v in enumerate(enum.value) if (5, i, 2, j) not in commented]
    for i, svc in enumerate(f.service):
        missing += [m.name for j, m in enumerate(svc.method) if (6, i, 2, j) not in commented]
    assert missing == []
