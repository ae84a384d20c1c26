"""The transport limit: a bare grpc.aio server that answers Predict with fixed bytes.

It registers /tensord.v1.InferenceService/Predict exactly as the generated code does for
the daemon (generic plus registered method handlers, same server options, and the same
event loop: uvloop where installed, as the daemon's default `event_loop = "auto"` picks),
but with no (de)serialisers and no work: request bytes in, a PredictResponse-sized reply
out. The rate a load generator gets from it is what grpcio alone allows on this host.

Run as a subprocess: `python echo_server.py --listen 127.0.0.1:0`; it prints
`LISTENING <port>` on stdout once it accepts calls, and exits on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

import grpc
from payloads import METHOD, MODEL, OUTPUT_FEATURES, SERVICE, response_bytes

from tensord.config import ServerSettings
from tensord.eventloop import run

# The daemon's defaults (tensord.config.ServerSettings): keep the two servers alike.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def _handlers(reply: bytes) -> dict[str, grpc.RpcMethodHandler]:
    async def predict(request: bytes, context: Any) -> bytes:
        return reply

    return {METHOD: grpc.unary_unary_rpc_method_handler(predict)}


async def serve(listen: str, reply: bytes) -> None:
    """Serve until SIGTERM or SIGINT, answering `reply`; print the bound port first."""
    await serve_handlers(listen, _handlers(reply))


async def serve_handlers(listen: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    """Serve the Predict `handlers` with the daemon's server options until SIGTERM or
    SIGINT; print `LISTENING <port>` once calls are accepted."""
    server = grpc.aio.server(options=_SERVER_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
    port = server.add_insecure_port(listen)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"LISTENING {port}", flush=True)
    await stop.wait()
    await server.stop(0.5)


def main() -> int:
    """Parse --listen and serve."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT; port 0 picks one")
    parser.add_argument(
        "--event-loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="as the daemon's [server] event_loop (auto: uvloop where installed)",
    )
    parser.add_argument("--model", default=MODEL, help=f"the model named in the reply ({MODEL})")
    parser.add_argument(
        "--features",
        type=int,
        default=OUTPUT_FEATURES,
        help=f"float32 values of the reply's batch-1 output ({OUTPUT_FEATURES})",
    )
    args = parser.parse_args()
    # The daemon's GIL switch interval ([server] switch_interval_us, its default here).
    sys.setswitchinterval(ServerSettings().switch_interval_us / 1e6)
    run(serve(args.listen, response_bytes(args.model, args.features)), args.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
