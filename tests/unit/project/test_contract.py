"""The contract: generated stubs match the .proto, buf lint passes, every element is commented."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from google.protobuf import descriptor_pb2

from tests.tools import buf, require_module

ROOT = Path(__file__).resolve().parents[3]
PROTO = ROOT / "protos" / "tensord" / "v1" / "inference.proto"
GENERATED = ROOT / "clients" / "python" / "tensord_client" / "v1"


def test_generated_code_is_current() -> None:
    """The stubs in the client package are what `make proto` makes of the .proto now."""
    require_module("grpc_tools")
    spec = importlib.util.spec_from_file_location(
        "generate_stubs", ROOT / "clients" / "python" / "generate_stubs.py"
    )
    assert spec is not None and spec.loader is not None
    generate_stubs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate_stubs)
    fresh = generate_stubs.generate()
    assert sorted(fresh) == ["inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py"]
    for name, text in fresh.items():
        assert (GENERATED / name).read_text() == text, f"{name} is stale: run `make proto`"


def test_daemon_and_client_share_one_copy_of_the_stubs() -> None:
    import tensord.v1.inference_pb2_grpc
    from tensord.v1 import inference_pb2
    from tensord_client.v1 import inference_pb2 as client_pb2
    from tensord_client.v1 import inference_pb2_grpc as client_pb2_grpc

    assert inference_pb2 is client_pb2
    assert tensord.v1.inference_pb2_grpc is client_pb2_grpc
    assert client_pb2.PredictRequest.__module__ == "tensord_client.v1.inference_pb2"
    # The descriptor keeps the .proto's own name, as reflection and other languages see it.
    assert client_pb2.DESCRIPTOR.name == "tensord/v1/inference.proto"
    assert not list((ROOT / "daemon" / "tensord" / "v1").glob("*_pb2*"))


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
