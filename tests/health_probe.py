"""A third process that calls InferenceService/Health every 10 ms and prints each call's
start time (time.monotonic) and latency in milliseconds, one line per call, until it reads
a line on stdin or `seconds` pass. Used by tests/e2e/test_hostile_requests.py.

    python -P tests/health_probe.py HOST:PORT SECONDS   (-P: tests/grpc is not grpc)
"""

from __future__ import annotations

import select
import sys
import time

import grpc

from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc


def main() -> int:
    target, seconds = sys.argv[1], float(sys.argv[2])
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        stub.Health(pb.HealthRequest(), timeout=10)  # connected before the first mark
        print("READY", flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            try:
                stub.Health(pb.HealthRequest(), timeout=10)
                status = "OK"
            except grpc.RpcError as exc:
                status = exc.code().name
            print(f"{start:.4f} {(time.monotonic() - start) * 1e3:.2f} {status}", flush=True)
            if select.select([sys.stdin], [], [], 0.01)[0]:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
