"""The `tensord` command: serve, inspect a model file, check a config, build the demo repo."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from tensord import __version__
from tensord.config import env_keys, load_config
from tensord.errors import ConfigError, ModelLoadError
from tensord_client.cli import quiet_on_broken_pipe


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", type=Path, help="TOML config file (TENSORD_CONFIG)")
    parser.add_argument("--listen", help="HOST:PORT to listen on (server.listen)")
    parser.add_argument("--model-repository", help="model repository directory")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", choices=["auto", "json", "console"])


# The setting each flag overrides, and the flag an error about it names.
_FLAGS = {
    "server.listen": "--listen",
    "model_repository": "--model-repository",
    "server.log_level": "--log-level",
    "server.log_format": "--log-format",
}


def _config_from(args: argparse.Namespace) -> Any:
    import os

    path = args.config or (
        Path(os.environ["TENSORD_CONFIG"]) if os.environ.get("TENSORD_CONFIG") else None
    )
    return load_config(
        path,
        overrides={key: getattr(args, flag[2:].replace("-", "_")) for key, flag in _FLAGS.items()},
        override_names=_FLAGS,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground until SIGTERM or SIGINT."""
    from tensord.eventloop import run
    from tensord.logs import configure_logging
    from tensord.server.app import TensordServer

    config = _config_from(args)
    configure_logging(config.server.log_format, config.server.log_level)
    try:
        if args.role is not None:
            return run(_serve_child(args, config), config.server.event_loop)
        from tensord.procs.supervisor import frontend_count

        frontends = frontend_count(config)
        if frontends:
            supervise = _supervise(config, frontends, lambda: _config_from(args))
            return run(supervise, config.server.event_loop)
        main = _serve(TensordServer, config, lambda: _config_from(args))
        return run(main, config.server.event_loop)
    except (OSError, ModelLoadError, RuntimeError) as exc:
        print(f"tensord: {exc}", file=sys.stderr)
        return 1


def _serve_args(given: list[str]) -> list[str]:
    """The `serve` command's arguments without --listen (a child is given the port)."""
    argv = given[given.index("serve") + 1 :] if "serve" in given else []
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--listen":
            skip = True
        elif not arg.startswith("--listen="):
            kept.append(arg)
    return kept


async def _supervise(config: Any, frontends: int, config_loader: Any) -> int:
    from tensord.procs.supervisor import Supervisor

    return await Supervisor(config, _serve_args(_ARGV), frontends, config_loader).run()


async def _serve_child(args: argparse.Namespace, config: Any) -> int:
    from tensord.procs.children import run_engine, run_frontend

    if args.control_fd is None:
        raise RuntimeError("--role needs --control-fd (the supervisor starts its children)")
    if args.role == "engine":
        return await run_engine(config, args.control_fd, lambda: _config_from(args))
    return await run_frontend(
        config, args.control_fd, args.frontend_index, lambda: _config_from(args)
    )


async def _serve(server_cls: Any, config: Any, config_loader: Any = None) -> int:
    # The grpc.aio server binds to the loop it is created in: create it inside the loop.
    # On SIGHUP the server calls config_loader to read the file, variables and flags again.
    server = server_cls(config, config_loader=config_loader)
    hint = None
    if _on_a_terminal(config.server.log_format) or os.environ.get("TENSORD_SAY_HOW_TO_CALL"):
        hint = asyncio.ensure_future(_say_how_to_call(server))
    try:
        return int(await server.serve_until_signal())
    finally:
        if hint is not None:
            hint.cancel()


def _on_a_terminal(log_format: str) -> bool:
    return log_format == "console" or (log_format == "auto" and sys.stdout.isatty())


async def _say_how_to_call(server: Any) -> None:
    """Once started, on a terminal (or under `make serve`, which sets
    TENSORD_SAY_HOW_TO_CALL): where the commands are and one to call the daemon. Off a
    terminal the lines go to stderr, so that stdout stays JSON log lines."""
    await server.wait_started()
    target = f"127.0.0.1:{server.port}"
    listen = server.config.server.listen
    if listen.rsplit(":", 1)[0] not in ("0.0.0.0", "[::]", "127.0.0.1", "localhost"):
        target = f"{listen.rsplit(':', 1)[0]}:{server.port}"
    lines = await asyncio.to_thread(_how_to_call, target)  # it looks at files
    out = sys.stdout if sys.stdout.isatty() else sys.stderr
    print("\n".join(lines), file=out, flush=True)


def _how_to_call(target: str) -> list[str]:
    """Where tensorctl is (in this venv, to activate, or on the PATH) and a command that
    calls the daemon at `target`."""
    bin_dir = Path(sys.executable).parent
    tensorctl = bin_dir / "tensorctl"
    lines = [f"tensord is listening on {target}. In another shell:"]
    if (bin_dir / "activate").exists():
        try:
            activate = os.path.relpath(bin_dir / "activate")
        except ValueError:
            activate = str(bin_dir / "activate")
        lines.append(f"    source {activate}      # tensord and tensorctl on the PATH")
        command = "tensorctl"
    else:
        command = str(tensorctl) if tensorctl.exists() else "tensorctl"
    default = target == "127.0.0.1:50051"
    lines.append(f"    {command}{'' if default else f' --target {target}'} health")
    return lines


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate the config file, the model repository (each model's graph, read with onnx:
    no runtime session), the TLS files and the token file. The effective settings go to
    stdout as JSON; the report (each model's versions, kind, inputs and outputs, or why it
    cannot be served; each entry skipped) to stderr. Exit 1 when something is broken."""
    from tensord.repository_check import check_repository, report_lines

    config = _config_from(args)
    check = check_repository(config.model_repository, config.follow_model_symlinks)
    print(json.dumps(config.model_dump(mode="json"), indent=2))
    sys.stdout.flush()  # the settings, then the report, on a terminal too
    for line in report_lines(check):
        print(line, file=sys.stderr)
    security = _security_problems(config)
    for line in security:
        print(f"security problem: {line}", file=sys.stderr)
    broken = any(model.broken for model in check.models)
    return 1 if broken or security else 0


def _security_problems(config: Any) -> list[str]:
    """Read the certificates and the token file as the server would."""
    from tensord.server.auth import read_token_file
    from tensord.server.tls import read_certificates

    problems = []
    try:
        if config.tls.enabled:
            read_certificates(config.tls)
    except ConfigError as exc:
        problems.append(str(exc))
    try:
        if config.auth.enabled:
            read_token_file(config.auth.token_file, config.auth)
    except ConfigError as exc:
        problems.append(str(exc))
    return problems


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe an ONNX file: signature, opset, producer, metadata, size, usable providers."""
    from tensord.inspect import inspect_model

    report = inspect_model(args.model)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['path']}  ({report['size_bytes']} bytes)")
    for file in report["external_data"]:
        size = "missing" if file["size_bytes"] is None else f"{file['size_bytes']} bytes"
        print(f"  weights in {file['path']}  ({size})")
    print(
        f"producer: {report['producer']}  opsets: {report['opsets']}  "
        f"ir_version: {report['ir_version']}"
    )
    for kind in ("inputs", "outputs"):
        print(f"{kind}:")
        for t in report[kind]:
            dims = ", ".join(str(d) for d in t["dims"])
            print(f"  {t['name']:<24} {t['dtype']:<10} [{dims}]")
    if report["metadata"]:
        print("metadata:")
        for key, value in report["metadata"].items():
            print(f"  {key} = {value}")
    print(f"providers that can run it: {', '.join(report['runnable_providers'])}")
    for provider, reason in report["unrunnable_providers"].items():
        print(f"  not {provider}: {reason}")
    if "generator" in report:
        _print_generator(report["generator"])
    if "embedding" in report:
        _print_embedding(report["embedding"])
    return 0


def _print_embedding(e: dict[str, Any]) -> None:
    """The embedding part of `tensord inspect`: can Embed serve the folder, and how."""
    if e["servable"]:
        print(f"Embed: can serve it: {e['description']}")
    else:
        print(f"Embed: cannot serve it: {e['reason']}")


def _print_generator(generator: dict[str, Any]) -> None:
    """The decoder part of `tensord inspect`: can Generate serve it, and how."""
    if not generator["servable"]:
        print(f"Generate: cannot serve it: {generator['reason']}")
        return
    g = generator
    context = g["context_length"] or "none declared"
    print(
        f"Generate: can serve it ({g['model_type'] or 'no model_type'}: {g['layers']} layers, "
        f"{g['attention_heads']} heads, {g['kv_heads']} KV heads of {g['head_dim']}, "
        f"context {context}, {g['kv_bytes_per_token']} KV bytes a token)"
    )
    if g.get("kv_path") == "slots":
        print(f"  {g['layout']}, built for {', '.join(g['built_for'])}")
        if g["sliding_window"]:
            w = g["sliding_window"]
            print(f"  sliding window of {w['window_size']} on layers {w['layers']}")
        print(f"  KV path: slots: {g['kv_path_reason']}")
        print(
            f"  one slot: {g['slot_bytes_at_default_max_model_len']} bytes at max_model_len "
            f"{g['default_max_model_len']}"
        )
        reuse = "reused" if g["prefix_reuse"] else "not reused"
        print(f"  prompt prefixes: {reuse}: {g['prefix_reuse_reason']}")
    elif g.get("kv_path"):
        print(f"  KV path: {g['kv_path']}: {g['kv_path_reason']}")
    print(f"  batch layout: {g['batch_layout']}: {g['batch_layout_reason']}")
    for note in g["notes"]:
        print(f"  note: {note}")


def cmd_demo_repo(args: argparse.Namespace) -> int:
    """Build the demo model repository (mlp, cnn, tinylm) locally."""
    from tensord.demo.repository import build_demo_repository

    written = build_demo_repository(args.path, force=args.force)
    print(f"demo repository at {args.path}: {len(written)} model file(s) written")
    return 0


def cmd_hash_token(args: argparse.Namespace) -> int:
    """Print a token-file entry: for a new random token, or for one read from stdin."""
    from tensord.server.auth import MIN_TOKEN_LENGTH, hash_token, new_token, token_entry

    if args.stdin:
        token = sys.stdin.readline().strip()
        if len(token) < MIN_TOKEN_LENGTH:
            print(
                f"tensord: a token needs at least {MIN_TOKEN_LENGTH} characters; leave out "
                "--stdin to have a random one made",
                file=sys.stderr,
            )
            return 2
    else:
        token = new_token()
        print(f"# token for the client (stored nowhere else): {token}", file=sys.stderr)
    models = args.model or ["*"]
    print(token_entry(args.name, hash_token(token), models, args.rate, args.burst), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the commands)."""
    env = ", ".join(sorted(env_keys()))
    parser = argparse.ArgumentParser(
        prog="tensord",
        description="gRPC inference daemon for GPU hosts.",
        epilog=f"Settings come from the config file, then environment variables ({env}), "
        "then flags.",
    )
    parser.add_argument("--version", action="version", version=f"tensord {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon in the foreground")
    _add_config_flags(serve)
    # A child of the supervisor ([server] frontends > 0); not for people to give.
    serve.add_argument("--role", choices=["engine", "frontend"], help=argparse.SUPPRESS)
    serve.add_argument("--control-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--frontend-index", type=int, default=0, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser(
        "check-config",
        help="validate the config, the model repository (each model's graph, inputs and "
        "outputs), the TLS files and the token file",
    )
    _add_config_flags(check)
    check.set_defaults(func=cmd_check_config)
    insp = sub.add_parser("inspect", help="describe an ONNX model file, or a model folder")
    insp.add_argument("model", type=Path)
    insp.add_argument("--json", action="store_true", help="print JSON")
    insp.set_defaults(func=cmd_inspect)
    demo = sub.add_parser("demo-repo", help="build the demo model repository")
    demo.add_argument("path", type=Path)
    demo.add_argument("--force", action="store_true", help="rebuild existing models")
    demo.set_defaults(func=cmd_demo_repo)
    hasher = sub.add_parser(
        "hash-token",
        help="print a [[token]] entry for the token file (append stdout to the file)",
    )
    hasher.add_argument("--name", required=True, help="the token's name in logs and messages")
    hasher.add_argument("--model", action="append", help="a model it may use; repeat (default *)")
    hasher.add_argument("--rate", type=float, default=0.0, help="requests/s (default: [auth])")
    hasher.add_argument("--burst", type=int, default=0, help="bucket size (default: [auth])")
    hasher.add_argument(
        "--stdin", action="store_true", help="hash the token on stdin instead of making one"
    )
    hasher.set_defaults(func=cmd_hash_token)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tensord` command; a reader that leaves early (`tensord inspect
    --json model.onnx | head`) ends it quietly, with status 1."""
    return quiet_on_broken_pipe(_run, argv)


_ARGV: list[str] = []
"""The command line `main` was given (the supervisor passes `serve`'s on to its children)."""


def _run(argv: list[str] | None) -> int:
    _ARGV[:] = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, ModelLoadError) as exc:
        print(f"tensord: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
