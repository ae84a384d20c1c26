"""`tensorctl`: health, info, predict and generate against a tensord, as tables or JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.json_format import MessageToDict

from tensord.dtypes import DType
from tensord.v1 import inference_pb2 as pb
from tensord_client._common import DEFAULT_TARGET, TLSOptions
from tensord_client.client import Client


def _to_dict(message: Any) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def cmd_health(client: Client, args: argparse.Namespace) -> int:
    """Print server and model health; exit 1 unless the server is serving."""
    reply = client.health(args.model or "")
    if args.json:
        print(json.dumps(_to_dict(reply), indent=2))
    else:
        print(f"server: {pb.ServingStatus.Name(reply.status).removeprefix('SERVING_STATUS_')}")
        rows = [
            [
                m.name,
                str(m.version),
                pb.ModelState.Name(m.state).removeprefix("MODEL_STATE_"),
                m.reason,
            ]
            for m in reply.models
        ]
        print(_table(rows, ["MODEL", "VERSION", "STATE", "REASON"]))
    return 0 if reply.status == pb.SERVING_STATUS_SERVING else 1


def _spec(specs: Any) -> str:
    return ", ".join(
        f"{s.name}:{pb.DataType.Name(s.dtype).removeprefix('DATA_TYPE_').lower()}{list(s.shape)}"
        for s in specs
    )


def cmd_info(client: Client, args: argparse.Namespace) -> int:
    """Print the server, devices, providers and models."""
    reply = client.info()
    if args.json:
        print(json.dumps(_to_dict(reply), indent=2))
        return 0
    r = reply.runtime
    print(
        f"tensord {reply.server_version}  python {r.python}  "
        f"onnxruntime {r.onnxruntime}  grpcio {r.grpcio}"
        + (f"  event loop {r.event_loop}" if r.event_loop else "")
    )
    print(f"cpu: {reply.cpu.model} ({reply.cpu.architecture}, {reply.cpu.logical_cores} cores)")
    for gpu in reply.gpus:
        print(
            f"gpu {gpu.index}: {gpu.name}, {gpu.total_memory_bytes / 2**30:.1f} GiB, "
            f"sm {gpu.compute_capability}"
        )
    if not reply.gpus:
        print(f"gpu: none ({reply.gpu_unavailable_reason})")
    print(f"providers: {', '.join(reply.available_providers)}")
    rows = [
        [
            m.name,
            str(m.version),
            pb.ModelState.Name(m.state).removeprefix("MODEL_STATE_"),
            m.kind or "predict",
            m.provider,
            str(m.max_batch_size),
            *(_generator_io(m) if m.HasField("generator") else (_spec(m.inputs), _spec(m.outputs))),
        ]
        for m in reply.models
    ]
    print(
        _table(
            rows,
            ["MODEL", "VERSION", "STATE", "KIND", "PROVIDER", "MAX_BATCH", "INPUTS", "OUTPUTS"],
        )
    )
    return 0


def _generator_io(m: pb.ModelInfo) -> tuple[str, str]:
    """A generator's columns: what Generate takes and streams, not its KV tensors (--json
    lists those)."""
    g = m.generator
    kv = g.kv_cache
    return (
        f"prompt (text or token ids), up to {g.max_model_len} tokens",
        f"token stream; {g.running} running, {g.waiting} waiting, KV blocks "
        f"{kv.used_blocks}/{kv.total_blocks}",
    )


def _input_dtypes(client: Client, model: str, version: int) -> dict[str, DType]:
    for m in client.info().models:
        if m.name == model and (version in (0, m.version)) and m.inputs:
            return {s.name: DType(s.dtype) for s in m.inputs}
    return {}


def parse_inputs(specs: list[str], dtypes: dict[str, DType]) -> dict[str, np.ndarray]:
    """`name=file.npy` loads a file; `name=JSON` takes a nested list, cast to the model's dtype."""
    inputs = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"tensorctl: --input expects NAME=FILE.npy or NAME=JSON, got {spec!r}")
        if value.endswith(".npy"):
            inputs[name] = np.load(value, allow_pickle=False)
            continue
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SystemExit(
                f"tensorctl: --input {name}: not a .npy path nor JSON: {exc}"
            ) from None
        dtype = dtypes.get(name)
        inputs[name] = np.array(data, dtype=dtype.numpy if dtype is not None else None)
    return inputs


def cmd_predict(client: Client, args: argparse.Namespace) -> int:
    """Run a model; print the outputs, or write them as .npy files."""
    dtypes = (
        _input_dtypes(client, args.model, args.version)
        if any(not s.endswith(".npy") for s in args.input)
        else {}
    )
    inputs = parse_inputs(args.input, dtypes)
    outputs = client.predict(args.model, inputs, version=args.version, outputs=args.output or None)
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        for name, array in outputs.items():
            path = args.output_dir / f"{name}.npy"
            np.save(path, array)
            print(f"{name}: {array.dtype} {list(array.shape)} -> {path}", file=sys.stderr)
        return 0
    if args.json:
        print(
            json.dumps(
                {
                    name: {"dtype": str(a.dtype), "shape": list(a.shape), "values": a.tolist()}
                    for name, a in outputs.items()
                },
                default=str,
            )
        )
        return 0
    for name, array in outputs.items():
        print(f"{name}: {array.dtype} {list(array.shape)}")
        print(np.array2string(array, threshold=200, precision=6))
    return 0


_SAMPLING = ("max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed")
_FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}


def cmd_generate(client: Client, args: argparse.Namespace) -> int:
    """Stream a generation: the text as it comes, or one JSON record per chunk."""
    sampling: dict[str, Any] = {name: getattr(args, name) for name in _SAMPLING}
    sampling.update(
        stop=args.stop or None,
        stop_token_ids=args.stop_token_id or None,
        ignore_eos=args.ignore_eos or None,
        logprobs=args.logprobs or None,
    )
    token_ids = [int(t) for t in args.token_ids.split(",")] if args.token_ids else None
    last = None
    for chunk in client.generate(
        args.model, args.prompt, token_ids=token_ids, version=args.version, **sampling
    ):
        if args.json:
            print(json.dumps(_to_dict(chunk)), flush=True)
        else:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        last = chunk
    if not args.json:
        sys.stdout.write("\n")
        if last is not None and last.HasField("usage"):
            u = last.usage
            print(
                f"[{_FINISH.get(last.finish_reason, '?')}: {u.prompt_tokens} prompt + "
                f"{u.completion_tokens} generated tokens, first token "
                f"{u.time_to_first_token_ms:.1f} ms, {u.mean_inter_token_ms:.1f} ms/token]",
                file=sys.stderr,
            )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """tensorctl's arguments."""
    parser = argparse.ArgumentParser(prog="tensorctl", description="Talk to a tensord daemon.")
    parser.add_argument(
        "--target", "-t", default=DEFAULT_TARGET, help=f"HOST:PORT (default {DEFAULT_TARGET})"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline per call in seconds")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--tls-ca", type=Path, help="CA bundle (PEM) to verify the server: enables TLS"
    )
    parser.add_argument("--tls-cert", type=Path, help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-key", type=Path, help="client private key (PEM) for mutual TLS")
    parser.add_argument(
        "--tls-server-name", help="name to verify in the server's certificate, if not the target's"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("TENSORD_TOKEN") or None,
        help="bearer token sent on every call (default: $TENSORD_TOKEN)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    health = sub.add_parser("health", help="server and model health (exit 1 if not serving)")
    health.add_argument("model", nargs="?", help="one model only")
    health.set_defaults(func=cmd_health)
    sub.add_parser("info", help="server, devices, providers and models").set_defaults(func=cmd_info)
    predict = sub.add_parser("predict", help="run a model on tensors")
    predict.add_argument("model")
    predict.add_argument(
        "--input",
        "-i",
        action="append",
        default=[],
        required=True,
        help="NAME=FILE.npy or NAME=JSON (JSON is cast to the model's dtype); repeat",
    )
    predict.add_argument("--output", "-o", action="append", help="only this output; repeat")
    predict.add_argument("--output-dir", type=Path, help="write each output to DIR/NAME.npy")
    predict.add_argument("--version", type=int, default=0, help="model version (0: newest ready)")
    predict.set_defaults(func=cmd_predict)
    generate = sub.add_parser("generate", help="stream tokens from a generator model")
    generate.add_argument("model")
    generate.add_argument("prompt", nargs="?", help="the prompt text (or --token-ids)")
    generate.add_argument("--token-ids", help="the prompt as comma-separated token ids")
    generate.add_argument("--version", type=int, default=0, help="model version (0: newest)")
    generate.add_argument("--max-tokens", type=int, help="most tokens to generate")
    generate.add_argument("--temperature", type=float, help="0 is greedy")
    generate.add_argument("--top-k", type=int, help="keep the k most likely tokens (0: all)")
    generate.add_argument("--top-p", type=float, help="nucleus probability in (0, 1]")
    generate.add_argument("--repetition-penalty", type=float, help="1 is none")
    generate.add_argument("--seed", type=int, help="random seed for reproducible sampling")
    generate.add_argument("--stop", action="append", help="stop sequence; repeat")
    generate.add_argument("--stop-token-id", type=int, action="append", help="repeat")
    generate.add_argument("--ignore-eos", action="store_true", help="go on past end-of-sequence")
    generate.add_argument("--logprobs", type=int, default=0, help="top alternatives per token")
    generate.set_defaults(func=cmd_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `tensorctl`."""
    args = build_parser().parse_args(argv)
    tls = None
    if args.tls_ca or args.tls_cert:
        if bool(args.tls_cert) != bool(args.tls_key):
            raise SystemExit("tensorctl: --tls-cert and --tls-key go together (mutual TLS)")
        tls = TLSOptions(
            root_certificates=args.tls_ca,
            certificate_chain=args.tls_cert,
            private_key=args.tls_key,
            server_name_override=args.tls_server_name,
        )
    try:
        with Client(args.target, timeout=args.timeout, tls=tls, token=args.token) as client:
            return int(args.func(client, args))
    except grpc.RpcError as exc:
        print(f"tensorctl: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
