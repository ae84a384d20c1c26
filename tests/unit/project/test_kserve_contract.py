"""The Open Inference Protocol's generated modules match the vendored protos, which stay
as Triton publishes them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.tools import require_module

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "clients" / "python" / "tensord_client" / "kserve" / "v2"
PROTOS = ROOT / "protos" / "third_party" / "triton"


def test_generated_code_is_current() -> None:
    """The modules in the client package are what `make proto` makes of the protos now."""
    require_module("grpc_tools")
    spec = importlib.util.spec_from_file_location(
        "kserve_stubs", ROOT / "tools" / "kserve_stubs.py"
    )
    assert spec is not None and spec.loader is not None
    kserve_stubs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kserve_stubs)
    fresh = kserve_stubs.generate()
    assert sorted(fresh) == [
        "grpc_service_pb2.py",
        "grpc_service_pb2.pyi",
        "grpc_service_pb2_grpc.py",
        "model_config_pb2.py",
        "model_config_pb2.pyi",
    ]
    for name, text in fresh.items():
        assert (GENERATED / name).read_text() == text, f"{name} is stale: run `make proto`"


def test_protos_keep_their_published_names_and_licence() -> None:
    from tensord.kserve.v2 import grpc_service_pb2, model_config_pb2

    assert grpc_service_pb2.DESCRIPTOR.name == "grpc_service.proto"
    assert grpc_service_pb2.DESCRIPTOR.package == "inference"
    assert model_config_pb2.DESCRIPTOR.name == "model_config.proto"
    assert "inference.GRPCInferenceService" in {
        s.full_name for s in grpc_service_pb2.DESCRIPTOR.services_by_name.values()
    }
    for name in ("grpc_service.proto", "model_config.proto"):
        head = (PROTOS / name).read_text()[:2000]
        assert "NVIDIA CORPORATION" in head and "Redistribution and use" in head


def test_daemon_and_client_share_one_copy() -> None:
    import tensord.kserve.v2.grpc_service_pb2_grpc
    from tensord.kserve.v2 import grpc_service_pb2, model_config_pb2
    from tensord_client.kserve.v2 import grpc_service_pb2 as client_pb2
    from tensord_client.kserve.v2 import grpc_service_pb2_grpc as client_pb2_grpc
    from tensord_client.kserve.v2 import model_config_pb2 as client_config_pb2

    assert grpc_service_pb2 is client_pb2 and model_config_pb2 is client_config_pb2
    assert tensord.kserve.v2.grpc_service_pb2_grpc is client_pb2_grpc
    assert client_pb2.ModelInferRequest.__module__ == "tensord_client.kserve.v2.grpc_service_pb2"
    assert not list((ROOT / "daemon" / "tensord" / "kserve" / "v2").glob("*_pb2*"))
