"""The contract's generated stubs under the daemon's name, `tensord.v1`.

The client distribution (tensord-client, a dependency) carries the one copy, as
`tensord_client.v1`: both sides use the same modules, and `import tensord.v1.inference_pb2`
finds them too.
"""

import sys

from tensord_client.v1 import inference_pb2, inference_pb2_grpc

sys.modules[f"{__name__}.inference_pb2"] = inference_pb2
sys.modules[f"{__name__}.inference_pb2_grpc"] = inference_pb2_grpc

__all__ = ["inference_pb2", "inference_pb2_grpc"]
