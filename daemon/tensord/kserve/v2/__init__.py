"""The Open Inference Protocol's generated modules under the daemon's name,
`tensord.kserve.v2`.

The client distribution (tensord-client, a dependency) carries the one copy, as
`tensord_client.kserve.v2`, as it does tensord.v1's: `import
tensord.kserve.v2.grpc_service_pb2` finds them too.
"""

import sys

from tensord_client.kserve.v2 import grpc_service_pb2, grpc_service_pb2_grpc, model_config_pb2

sys.modules[f"{__name__}.grpc_service_pb2"] = grpc_service_pb2
sys.modules[f"{__name__}.grpc_service_pb2_grpc"] = grpc_service_pb2_grpc
sys.modules[f"{__name__}.model_config_pb2"] = model_config_pb2

__all__ = ["grpc_service_pb2", "grpc_service_pb2_grpc", "model_config_pb2"]
