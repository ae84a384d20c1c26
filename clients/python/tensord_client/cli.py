"""`tensorctl`: health, info, predict and generate against a tensord, as tables or JSON."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import numpy as np
from google.protobuf.json_format import MessageToDict

from tensord_client._common import DEFAULT_TARGET, TARGET_ENV, TLSOptions, default_target
from tensord_client.client import Client
from tensord_client.dtypes import DType
from tensord_client.errors import DeadlineExceeded, NotFound, Unavailable
from tensord_client.results import Health, ModelInfo, ModelState, TensorSpec


def _to_dict(message: Any) -> dict[str, Any]:
    """A message as JSON-ready data with every field present, zeros and empties included,
    so scripts can index records without checking for keys."""
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


class UsageError(Exception):
    """A mistake in the command line or its files: printed as one line, exit status 2."""


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def _serving(reply: Health, model: str | None) -> bool:
    if model:  # as grpc.health.v1 says of tensord.model.<name>: some version is READY
        return reply.serving and any(m.state is ModelState.READY for m in reply.models)
    return reply.serving


_POLL_S = 0.25


def _health_within(client: Client, model: str | None, wait: float) -> Health:
    """Health, asked again until the server (and the model) serves or `wait` seconds pass.
    Meanwhile a daemon still starting (UNAVAILABLE), or a model it has not found yet
    (NOT_FOUND, before a reload picks it up), is waited for too."""
    deadline = time.monotonic() + wait
    while True:
        try:
            reply = client.health(model or "")
        except (Unavailable, NotFound, DeadlineExceeded):
            if time.monotonic() + _POLL_S > deadline:
                raise
        else:
            if _serving(reply, model) or time.monotonic() + _POLL_S > deadline:
                return reply
        time.sleep(_POLL_S)


def cmd_health(client: Client, args: argparse.Namespace) -> int:
    """Print server and model health; exit 1 unless the server is serving."""
    reply = _health_within(client, args.model, args.wait)
    if args.json:
        print(json.dumps(_to_dict(reply.proto), indent=2))
    else:
        print(f"server: {reply.status}")
        rows = [[m.name, str(m.version), m.state, m.reason] for m in reply.models]
        print(_table(rows, ["MODEL", "VERSION", "STATE", "REASON"]))
    return 0 if _serving(reply, args.model) else 1


def cmd_models(client: Client, args: argparse.Namespace) -> int:
    """Print every model of the repository: each loaded version's state, and those not
    loaded."""
    index = client.repository_index(ready=args.ready)
    if args.json:
        rows_json = [
            {"name": m.name, "version": m.version, "state": str(m.state), "reason": m.reason}
            for m in index
        ]
        print(json.dumps(rows_json, indent=2))
    else:
        rows = [[m.name, str(m.version or "-"), m.state, m.reason] for m in index]
        print(_table(rows, ["MODEL", "VERSION", "STATE", "REASON"]))
    return 0


def cmd_load(client: Client, args: argparse.Namespace) -> int:
    """Load a model of the repository; returns once it is READY."""
    client.load_model(args.model)
    print(f"{args.model}: loaded")
    return 0


def cmd_unload(client: Client, args: argparse.Namespace) -> int:
    """Unload a model; returns once its calls have ended."""
    done = client.unload_model(args.model)
    print(f"{args.model}: {'unloaded' if done else 'was not loaded'}")
    return 0


def _spec(specs: list[TensorSpec]) -> str:
    return ", ".join(
        f"{s.name}:{s.dtype.lower()}" + ("[rank unknown]" if s.unknown_rank else str(s.shape))
        for s in specs
    )


def cmd_info(client: Client, args: argparse.Namespace) -> int:
    """Print the server, devices, providers and models."""
    reply = client.info()
    if args.json:
        print(json.dumps(_to_dict(reply.proto), indent=2))
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
            m.state,
            m.kind or "predict",
            m.provider,
            str(m.max_batch_size),
            *(
                _generator_io(m)
                if m.proto.HasField("generator")
                else (_spec(m.inputs), _spec(m.outputs))
            ),
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


def _generator_io(m: ModelInfo) -> tuple[str, str]:
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
    """The inputs of the version a call would reach: the one asked for, else the newest
    READY one (the daemon's default), else the newest. Empty if Info cannot tell."""
    try:
        models = [m for m in client.info().models if m.name == model and m.inputs]
    except grpc.RpcError:
        return {}  # Predict itself reports what is wrong (unknown model, credentials, ...)
    if version:
        models = [m for m in models if m.version == version]
    ready = [m for m in models if m.state is ModelState.READY]
    chosen = max(ready or models, key=lambda m: m.version, default=None)
    if chosen is None:
        return {}
    return {s.name: DType[s.dtype] for s in chosen.inputs if s.dtype in DType.__members__}


def _split_spec(spec: str, known: dict[str, DType]) -> tuple[str, str]:
    """NAME=VALUE, where NAME may itself hold '=' if the model has such an input."""
    for name in sorted(known, key=len, reverse=True):
        if "=" in name and spec.startswith(name + "="):
            return name, spec[len(name) + 1 :]
    name, sep, value = spec.partition("=")
    if not sep or not name:
        raise UsageError(f"--input expects NAME=FILE.npy or NAME=JSON, got {spec!r}")
    return name, value


def _load_npy(name: str, path: str, dtype: DType | None) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--input {name}: cannot load {path!r} as a .npy array: {exc}") from None
    if not isinstance(array, np.ndarray):
        raise UsageError(f"--input {name}: {path!r} is not a single .npy array")
    if dtype is DType.BFLOAT16 and array.dtype.kind == "V" and array.dtype.itemsize == 2:
        array = array.view(dtype.numpy)  # NumPy writes bfloat16 as raw 2-byte records
    return array


def _from_json(name: str, data: Any, dtype: DType | None) -> np.ndarray:
    """A nested JSON list as an array of the model's dtype, refusing lossy casts."""
    try:
        loose = np.array(data)
        if dtype is None or dtype is DType.STRING:
            return loose if dtype is None else np.array(data, dtype=dtype.numpy)
        if loose.dtype.kind in "USO":
            raise UsageError(
                f"--input {name}: the model takes {dtype.name.lower()}, but the JSON holds "
                "strings or mixed values"
            )
        target = np.dtype(dtype.numpy)
        if target.kind in "iub" and loose.dtype.kind == "f":
            if not np.all(np.isfinite(loose)) or np.any(loose != np.round(loose)):
                raise UsageError(
                    f"--input {name}: the model takes {dtype.name.lower()}, but the JSON holds "
                    "non-integer numbers"
                )
            data = loose.astype(np.int64 if target.kind != "b" else np.bool_).tolist()
        return np.array(data, dtype=target)
    except (ValueError, OverflowError, TypeError) as exc:
        what = dtype.name.lower() if dtype is not None else "an array"
        raise UsageError(f"--input {name}: cannot make {what} of the JSON given: {exc}") from None


def parse_inputs(specs: list[str], dtypes: dict[str, DType]) -> dict[str, np.ndarray]:
    """`name=file.npy` loads a file; `name=JSON` takes a nested list, cast to the model's dtype."""
    inputs = {}
    for spec in specs:
        name, value = _split_spec(spec, dtypes)
        if value.endswith(".npy"):
            inputs[name] = _load_npy(name, value, dtypes.get(name))
            continue
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--input {name}: not a .npy path nor JSON: {exc}") from None
        inputs[name] = _from_json(name, data, dtypes.get(name))
    return inputs


def _file_name(name: str) -> str:
    """An output name as a file name that stays inside --output-dir."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return "_" + safe if safe.startswith(".") or not safe else safe


def _json_values(array: np.ndarray) -> Any:
    """An array as nested lists for JSON; NaN and infinities as the strings "NaN",
    "Infinity" and "-Infinity" (protobuf's JSON mapping), which every JSON parser reads."""
    if array.dtype.kind == "V":  # bfloat16
        array = array.astype(np.float32)
    if array.dtype.kind != "f" or np.all(np.isfinite(array)):
        return array.tolist()

    def number(x: float) -> float | str:
        if math.isfinite(x):
            return x
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")

    flat = [number(x) for x in array.reshape(-1).tolist()]
    return np.array(flat, dtype=object).reshape(array.shape).tolist()


def _savable(array: np.ndarray) -> np.ndarray:
    """String outputs as fixed-width Unicode, which np.load reads without pickle."""
    if array.dtype.kind == "O":
        return np.array([str(v) for v in array.reshape(-1)], dtype=str).reshape(array.shape)
    return array


def cmd_predict(client: Client, args: argparse.Namespace) -> int:
    """Run a model; print the outputs, or write them as .npy files."""
    dtypes = _input_dtypes(client, args.model, args.version)
    inputs = parse_inputs(args.input, dtypes)
    outputs = client.predict(args.model, inputs, version=args.version, outputs=args.output or None)
    if args.output_dir:
        paths = {name: args.output_dir / f"{_file_name(name)}.npy" for name in outputs}
        if len(set(paths.values())) < len(paths):
            raise UsageError(
                f"outputs {sorted(outputs)} would share a file name in --output-dir; "
                "ask for them one at a time with --output"
            )
        try:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            for name, array in outputs.items():
                np.save(paths[name], _savable(array))
                print(
                    f"{name}: {array.dtype} {list(array.shape)} -> {paths[name]}", file=sys.stderr
                )
        except OSError as exc:
            raise UsageError(f"--output-dir: {exc}") from None
        return 0
    if args.json:
        print(
            json.dumps(
                {
                    name: {"dtype": str(a.dtype), "shape": list(a.shape), "values": _json_values(a)}
                    for name, a in outputs.items()
                },
                default=str,
                allow_nan=False,
            )
        )
        return 0
    for name, array in outputs.items():
        print(f"{name}: {array.dtype} {list(array.shape)}")
        print(np.array2string(array, threshold=200, precision=6))
    return 0


_SAMPLING = ("max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed")


def cmd_generate(client: Client, args: argparse.Namespace) -> int:
    """Stream a generation: the text as it comes, or one JSON record per chunk."""
    sampling: dict[str, Any] = {name: getattr(args, name) for name in _SAMPLING}
    sampling.update(
        stop=args.stop or None,
        stop_token_ids=args.stop_token_id or None,
        ignore_eos=args.ignore_eos or None,
        logprobs=args.logprobs or None,
    )
    token_ids = args.token_ids
    last = None
    for chunk in client.generate(
        args.model, args.prompt, token_ids=token_ids, version=args.version, **sampling
    ):
        if args.json:
            print(json.dumps(_to_dict(chunk.proto)), flush=True)
        else:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        last = chunk
    if not args.json:
        sys.stdout.write("\n")
        if last is not None and last.usage is not None:
            u = last.usage
            print(
                f"[{str(last.finish_reason or '?').lower()}: {u.prompt_tokens} prompt + "
                f"{u.completion_tokens} generated tokens, first token "
                f"{u.time_to_first_token_ms:.1f} ms, {u.mean_inter_token_ms:.1f} ms/token]",
                file=sys.stderr,
            )
    return 0


def _token_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 1,15,27, got {text!r}"
        ) from None


_EXIT_STATUS = """exit status:
  0    success (health: the server is SERVING, and MODEL, if named, has a READY version)
  1    an error from the server or the connection (health: not serving, or no answer)
  2    a mistake in the command line or its files
  130  interrupted (Ctrl-C)"""

_HEALTH_EXIT_STATUS = """exit status:
  0  the server is SERVING (and MODEL, if named, has a READY version)
  1  it is not, or it did not answer (the reason is printed on stderr)
  2  a mistake in the command line"""

_ENVIRONMENT = f"""environment:
  {TARGET_ENV}  the daemon to talk to when --target is not given (default {DEFAULT_TARGET})
  TENSORD_TOKEN   the bearer token when --token is not given"""


Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What add_subparsers returns: each command is added to it."""


def build_parser() -> argparse.ArgumentParser:
    """tensorctl's arguments."""
    parser = argparse.ArgumentParser(
        prog="tensorctl",
        description="Talk to a tensord daemon.",
        epilog=f"{_ENVIRONMENT}\n\n{_EXIT_STATUS}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_connection_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_health_command(sub)
    sub.add_parser("info", help="server, devices, providers and models").set_defaults(func=cmd_info)
    _add_predict_command(sub)
    _add_generate_command(sub)
    _add_control_commands(sub)
    return parser


def _add_control_commands(sub: Any) -> None:
    models = sub.add_parser("models", help="every model of the repository, loaded or not")
    models.add_argument("--ready", action="store_true", help="only the READY versions")
    models.set_defaults(func=cmd_models)
    for name, func, what in (
        ("load", cmd_load, "load a model of the repository (model_control = explicit)"),
        ("unload", cmd_unload, "unload a model once its calls have ended"),
    ):
        command = sub.add_parser(name, help=what)
        command.add_argument("model")
        command.set_defaults(func=func)


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the daemon is and how to reach it: target, deadline, output, TLS, token."""
    parser.add_argument(
        "--target",
        "-t",
        help=f"HOST:PORT of the daemon (default: ${TARGET_ENV}, else {DEFAULT_TARGET})",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline per call in seconds")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--tls", action="store_true", help="use TLS, verifying the server with the system's CAs"
    )
    parser.add_argument(
        "--tls-ca", type=Path, help="CA bundle (PEM) to verify the server: enables TLS"
    )
    parser.add_argument("--tls-cert", type=Path, help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-key", type=Path, help="client private key (PEM) for mutual TLS")
    parser.add_argument(
        "--tls-server-name",
        help="name to verify in the server's certificate, if not the target's: enables TLS",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("TENSORD_TOKEN") or None,
        help="bearer token sent on every call (default: $TENSORD_TOKEN)",
    )


def _add_health_command(sub: Subcommands) -> None:
    """`tensorctl health [MODEL] [--wait SECONDS]`."""
    health = sub.add_parser(
        "health",
        help="server and model health (exit 1 if the server, or the model named, is not serving)",
        description="Print the server's status and each model version's state.",
        epilog=_HEALTH_EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    health.add_argument("model", nargs="?", help="one model only")
    health.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="ask again until it is serving, for up to SECONDS (a daemon still starting and "
        "a model not found yet are waited for too)",
    )
    health.set_defaults(func=cmd_health)


def _add_predict_command(sub: Subcommands) -> None:
    """`tensorctl predict MODEL --input NAME=VALUE ...`."""
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


def _add_generate_command(sub: Subcommands) -> None:
    """`tensorctl generate MODEL [PROMPT]` and its sampling settings."""
    generate = sub.add_parser("generate", help="stream tokens from a generator model")
    generate.add_argument("model")
    generate.add_argument("prompt", nargs="?", help="the prompt text (or --token-ids)")
    generate.add_argument(
        "--token-ids", type=_token_ids, help="the prompt as comma-separated token ids"
    )
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


def _tls(args: argparse.Namespace) -> TLSOptions | None:
    """TLS options when any TLS flag is given (never a silent fall back to plaintext)."""
    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_key or args.tls_server_name):
        return None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together (mutual TLS)")
    return TLSOptions(
        root_certificates=args.tls_ca,
        certificate_chain=args.tls_cert,
        private_key=args.tls_key,
        server_name_override=args.tls_server_name,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `tensorctl`: exit 0 on success, 1 for an error from the server or
    the connection, 2 for a mistake in the command line or its files, 130 on Ctrl-C."""
    return quiet_on_broken_pipe(_run, argv)


def quiet_on_broken_pipe(run: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """`run(argv)` for a command whose reader may leave early (`tensorctl --json info |
    head -1`): it ends quietly, with status 1, as the Python documentation's note on SIGPIPE
    does: the output is flushed here so that a broken pipe shows up here, and stdout then
    points at /dev/null so that the interpreter's own flush at exit finds nothing to write.
    The `tensord` command uses it too."""
    try:
        try:
            return run(argv)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        tls = _tls(args)
        target = args.target or default_target()
        with Client(target, timeout=args.timeout, tls=tls, token=args.token) as client:
            return int(args.func(client, args))
    except grpc.RpcError as exc:
        print(f"tensorctl: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"tensorctl: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # an array the contract cannot carry
        print(f"tensorctl: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # the reader left: main() ends quietly
    except OSError as exc:  # a TLS file that cannot be read, and the like
        print(f"tensorctl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
