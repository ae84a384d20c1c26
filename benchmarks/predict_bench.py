"""Predict throughput and latency of tensord against its two limits, in one run.

    python benchmarks/predict_bench.py [--duration S] [--concurrency 1,8,32,64,128] [--quick]

For each concurrency (calls in flight) it measures batch-1 Predict on the demo `mlp`:
  echo     a bare grpc.aio server answering the same bytes: the transport limit
  tensord  the daemon, `tensord serve`, as deployed
  floor    with --floor: a bare grpc.aio server running the model on a thread pool
with the identical load generator (benchmarks/loadgen.py, separate processes), and
ONNX Runtime in-process on the same model file and session options (the compute limit;
measured before and after the sweep, the faster counts). The unbatched serving limit is
1 / (1/echo + 1/ORT batch 1); tensord's rate is printed as a ratio to it. Everything it
starts is stopped on exit, Ctrl-C or error. The full results go to
benchmarks/results/predict-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# use_venv comes first: it re-runs this script under .venv when grpcio/tensord are missing.
import use_venv
from machine import machine_info
from payloads import MODEL, response_bytes
from point import LoadSpec, measure
from procs import ProcessGroup, exit_on_signals, pid_alive, python_script, read_line
from report import (
    BATCHED_TARGETS,
    TARGET_RATIO,
    TARGET_SPREAD,
    UNBATCHED_TARGETS,
    render,
    spread,
)
from servers import Server, start_echo, start_floor, start_tensord

REPO = use_venv.REPO
RESULTS_DIR = REPO / "benchmarks" / "results"
DEFAULT_REPOSITORY = REPO / "build" / "demo-models"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; --quick shortens every window."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, help="seconds measured per point (5; quick 1.5)")
    parser.add_argument("--warmup", type=float, help="seconds of load before each window (1)")
    parser.add_argument(
        "--concurrency",
        default="1,8,32,64,128",
        help="comma-separated calls in flight (default 1,8,32,64,128)",
    )
    parser.add_argument("--quick", action="store_true", help="1.5 s windows, 0.5 s warm-ups")
    parser.add_argument(
        "--client",
        choices=["auto", "aio", "sync"],
        default="auto",
        help="load generator driver; auto: sync at 1 in flight, aio above (see README)",
    )
    parser.add_argument(
        "--client-procs", type=int, default=1, help="load generator processes per point (1)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="per-call deadline sent, s; 0: none (30)"
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=DEFAULT_REPOSITORY,
        help="repository holding `mlp` (default build/demo-models; built when missing)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="windows per point and server; the median counts"
    )
    parser.add_argument(
        "--batching",
        action="store_true",
        help="serve a copy of the repository with [dynamic_batching] on for mlp; the limit "
        "then uses ONNX Runtime at batch 32 (the batched-serving limit)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure benchmarks/floor_server.py (a bare grpc.aio server running the "
        "model on instance_count threads) against the same limit (not with --batching)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    args.duration = args.duration or (1.5 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--concurrency: expected numbers like 1,8,32,64, got {args.concurrency!r}")
    if not args.concurrency or min(args.concurrency) < 1:
        parser.error("--concurrency: every value must be >= 1")
    if args.repeat < 1:
        parser.error("--repeat: must be >= 1")
    if args.floor and args.batching:
        parser.error("--floor: the floor server does not batch; leave out --batching")
    return args


def ensure_repository(path: Path) -> Path:
    """The repository; the default one is built with `tensord demo-repo` when missing."""
    path = path.resolve()
    if not (path / MODEL).is_dir():
        if path != DEFAULT_REPOSITORY.resolve():
            raise SystemExit(f"predict_bench: {path} has no {MODEL!r} model directory")
        tool = Path(sys.executable).parent / "tensord"
        cmd = [str(tool)] if tool.exists() else [sys.executable, "-m", "tensord.cli"]
        subprocess.run([*cmd, "demo-repo", str(path)], check=True)
    return path


def batching_copy(repository: Path, into: Path) -> Path:
    """A copy of the repository whose mlp batches (delay 0: join whatever is queued)."""
    copy = into / "models"
    shutil.copytree(repository, copy)
    toml = copy / MODEL / "model.toml"
    text = toml.read_text() if toml.exists() else ""
    if "[dynamic_batching]" not in text:
        if "max_batch_size" not in text:
            text += "max_batch_size = 128\n"
        text += "\n[dynamic_batching]\nmax_queue_delay_microseconds = 0\n"
        toml.write_text(text)
    return copy


def model_settings(repository: Path) -> dict[str, Any]:
    """The mlp's model.toml as the daemon reads it (thread counts, instances, batching)."""
    from tensord.modelconfig.model import read_model_config

    settings: dict[str, Any] = read_model_config(repository / MODEL).model_dump(mode="json")
    return settings


def run_ort_limit(procs: ProcessGroup, args: argparse.Namespace) -> dict[str, Any]:
    """The compute limit, in its own process while nothing else of ours runs.

    Batched, ONNX Runtime is measured at every batch size from 32 up to the model's
    max_batch_size (doubling) and the best counts."""
    sizes = [32]
    if args.batching:
        limit = int(model_settings(args.model_repository)["max_batch_size"])
        while sizes[-1] * 2 <= limit:
            sizes.append(sizes[-1] * 2)
    argv = python_script(
        "ort_limit.py",
        "--model-repository",
        str(args.model_repository),
        "--warmup",
        str(args.warmup),
        "--duration",
        str(args.duration),
        "--big-batches",
        ",".join(map(str, sizes)),
    )
    proc = procs.start(argv)
    try:
        timeout = (3 + len(sizes)) * args.duration + 120
        report: dict[str, Any] = json.loads(read_line(proc, timeout))
    finally:
        procs.stop(proc)
    return report


def client_for(concurrency: int, choice: str) -> str:
    """The driver for a point: sync has the least latency alone, aio scales (README)."""
    if choice != "auto":
        return choice
    return "sync" if concurrency == 1 else "aio"


def sweep(
    procs: ProcessGroup, servers: list[Server], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each concurrency against each server in turn (echo, then tensord), same load spec.

    With --repeat N each pair is measured N times back to back and the run with the median
    rate is kept per server (all rates are in `runs`): on a small shared VM single windows
    differ by 10-20 %.
    """
    points = []
    for concurrency in args.concurrency:
        spec = LoadSpec(
            concurrency=concurrency,
            client=client_for(concurrency, args.client),
            client_procs=args.client_procs,
            warmup_s=args.warmup,
            duration_s=args.duration,
            timeout_s=args.timeout,
        )
        runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
        for _ in range(args.repeat):
            for server in servers:
                idle = [s for s in servers if s is not server]
                print(f"  {server.name:<8} {concurrency:>3} in flight ...", end="", flush=True)
                m = measure(procs, server, spec, idle)
                runs[server.name].append(m)
                print(f" {m['rps']:>8,.0f} req/s", flush=True)
        point: dict[str, Any] = {"concurrency": concurrency}
        for name, measured in runs.items():
            ordered = sorted(measured, key=lambda m: float(m["rps"]))
            point[name] = ordered[(len(ordered) - 1) // 2]
        point["runs"] = {name: [m["rps"] for m in measured] for name, measured in runs.items()}
        points.append(point)
    return points


def wait_until_ready(procs: ProcessGroup, server: Server) -> None:
    """Block until the server answers Predict (the daemon loads models after it listens)."""
    proc = procs.start(python_script("loadgen.py", "--target", server.target, "--ready-only"))
    try:
        line = read_line(proc, 150.0).strip()
        if line != "READY":
            raise RuntimeError(f"{server.name} readiness probe said {line!r}")
    finally:
        procs.stop(proc)


def compute_rate(runs: list[dict[str, Any]], batching: bool, concurrency: int) -> tuple[float, str]:
    """The compute limit for one point (requests/s) and what it is: the faster of the runs
    before and after the sweep, of the figure that point uses.

    Unbatched, one call in flight runs one model at a time: ORT batch 1 on one thread. With
    more in flight the daemon runs `instance_count` of them at once, so the limit is ORT
    with that many threads (like with like: the echo rate it is combined with uses the
    whole machine too). Batched, it is ORT's samples/s at its best batch size."""
    if batching:
        best = max((r["big_batch"] for r in runs), key=lambda m: float(m["samples_per_s"]))
        return float(best["samples_per_s"]), f"ORT batch {best['batch']}"
    parallel = [r["batch1_parallel"] for r in runs if r.get("batch1_parallel")]
    if concurrency > 1 and parallel:
        best = max(parallel, key=lambda m: float(m["runs_per_s"]))
        return float(best["runs_per_s"]), f"ORT batch 1 x{best['threads']}"
    return max(float(r["batch1"]["runs_per_s"]) for r in runs), "ORT batch 1"


def add_ratios(points: list[dict[str, Any]], runs: list[dict[str, Any]], batching: bool) -> None:
    """limit = 1 / (1/echo + 1/compute rate) per point, tensord's ratio to it, and the
    verdict where the issue sets a target (unbatched: 1 and 32 in flight; batched: 64 in
    flight, with p99 <= 2.5 x p50 as well)."""
    targets = BATCHED_TARGETS if batching else UNBATCHED_TARGETS
    for p in points:
        echo_rps = p["echo"]["rps"]
        rate, label = compute_rate(runs, batching, p["concurrency"])
        limit = 1.0 / (1.0 / echo_rps + 1.0 / rate) if echo_rps > 0 else 0.0
        p["compute_rps"], p["compute_limit"] = rate, label
        p["limit_rps"] = limit
        p["ratio"] = p["tensord"]["rps"] / limit if limit > 0 else 0.0
        if "floor" in p:
            p["floor_ratio"] = p["floor"]["rps"] / limit if limit > 0 else 0.0
        p["p99_over_p50"] = spread(p["tensord"]["latency_us"])
        if p["concurrency"] not in targets:
            p["meets_target"] = None
            continue
        ok = p["ratio"] >= TARGET_RATIO
        if batching:
            ok = ok and p["p99_over_p50"] is not None and p["p99_over_p50"] <= TARGET_SPREAD
        p["meets_target"] = ok


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Limits first, then the sweep; returns the results dict (not yet written)."""
    args.model_repository = ensure_repository(args.model_repository)
    if args.batching:
        args.model_repository = batching_copy(
            args.model_repository, Path(tempfile.mkdtemp(prefix="tensord-bench-"))
        )
    stamp = datetime.now(UTC)
    results: dict[str, Any] = {
        "schema": 1,
        "started_at": stamp.isoformat(timespec="seconds"),
        "machine": machine_info(REPO),
        "settings": {
            "model": MODEL,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "concurrency": args.concurrency,
            "client": args.client,
            "client_procs": args.client_procs,
            "timeout_s": args.timeout,
            "repeat": args.repeat,
            "target_ratio": TARGET_RATIO,
            "batching": args.batching,
            "floor": args.floor,
        },
        "model_config": model_settings(args.model_repository),
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"predict-{stamp:%Y%m%d-%H%M%S}.json"
    with ProcessGroup() as procs, tempfile.TemporaryFile("w+") as daemon_log:
        print("ONNX Runtime in-process (compute limit) ...", flush=True)
        before = run_ort_limit(procs, args)
        print(f"  batch 1: {before['batch1']['runs_per_s']:,.0f} runs/s", flush=True)
        print("starting the echo server and tensord ...", flush=True)
        servers = [start_echo(procs), start_tensord(procs, args.model_repository, daemon_log)]
        if args.floor:
            servers.append(start_floor(procs, args.model_repository))
        for server in servers:
            wait_until_ready(procs, server)
        results["daemon"] = {"command": servers[1].proc.args, "pid": servers[1].pid}
        points = sweep(procs, servers, args)
        pids = [s.pid for s in servers]
        procs.stop_all()
        print("ONNX Runtime in-process again, after the sweep ...", flush=True)
        after = run_ort_limit(procs, args)
        print(f"  batch 1: {after['batch1']['runs_per_s']:,.0f} runs/s", flush=True)
        daemon_log.seek(0)
        log_lines = daemon_log.read().splitlines()
    # Interference only ever slows a run down: the faster of the two is the better limit.
    results["ort_runs"] = {"before": before, "after": after}
    results["ort"] = max(before, after, key=lambda r: float(r["batch1"]["runs_per_s"]))
    results["daemon"]["log_tail"] = log_lines[-20:]
    results["stopped_cleanly"] = not any(pid_alive(pid) for pid in pids)
    add_ratios(points, [before, after], args.batching)
    results["points"] = points
    results["payload"] = {
        "request_bytes": points[0]["echo"]["request_bytes"],
        "reply_bytes_echo": len(response_bytes()),
        "reply_bytes_tensord": points[0]["tensord"]["reply_bytes"],
    }
    results["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["results_file"] = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    """Run, write the JSON, print the table."""
    args = parse_args(argv)
    exit_on_signals()
    started = time.monotonic()
    try:
        results = run(args)
    except KeyboardInterrupt:
        print("\ninterrupted; everything started was stopped", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if isinstance(exc.code, int) and exc.code > 128:  # SIGTERM or SIGHUP
            print(
                f"\nstopped by signal {exc.code - 128}; everything started was stopped",
                file=sys.stderr,
            )
        raise
    print()
    print(render(results))
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
