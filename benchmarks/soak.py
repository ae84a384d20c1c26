"""Soak run: minutes of mixed load on one daemon, a reload in the middle, and what leaked.

    python benchmarks/soak.py [--minutes 1] [--in-flight 8] [--model-repository DIR]

The daemon serves a copy of the repository. Load is mixed: valid Predicts of random batch
sizes on every model, cancelled calls, calls with deadlines too short to make, bad inputs
(wrong shape, dtype, model, output name) and, where a generator model is served, Generate
streams of which some are cancelled mid-way. Half-way through, one model's file is
replaced and another model added, and the daemon gets SIGHUP; the run waits for its
READY=1 on a notify socket. Reported:

  RSS growth   the daemon's resident memory at the end against the end of the warm-up
               (target < 5 %)
  leaks        after the load stops: bytes still handed out by any buffer pool, runs
               still queued or running, KV cache blocks still in use (read from Info when
               it reports KV figures)
  errors       every call by kind and final status; a status a kind may not end with
               (a valid Predict that fails, say) is an unexpected error

Results go to benchmarks/results/soak-<timestamp>.json. Exit status 1 when a target is
missed (unexpected errors, leaks, RSS growth over the target).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import use_venv
from machine import machine_info
from procs import ProcessGroup, exit_on_signals, free_port, wait_for_port
from servers import tensord_command
from soak_load import Mix, SoakLoad, sample_rss

REPO = use_venv.REPO
RESULTS_DIR = REPO / "benchmarks" / "results"
DEFAULT_REPOSITORY = REPO / "build" / "demo-models"
HOST = "127.0.0.1"

sys.path.insert(0, str(REPO))
from tensord.v1 import inference_pb2 as pb  # noqa: E402
from tensord.v1 import inference_pb2_grpc as pb_grpc  # noqa: E402

# The test suite's stand-in for systemd's notify socket: the run waits for READY=1.
from tests.notify_socket import NotifyListener  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=1.0, help="length of the run (1)")
    parser.add_argument(
        "--warmup", type=float, help="seconds before the RSS baseline (20%% of the run, <= 60)"
    )
    parser.add_argument("--in-flight", type=int, default=8, help="calls kept in flight (8)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--rss-target", type=float, default=5.0, help="max RSS growth, %%")
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    return parser.parse_args(argv)


def stage_repository(source: Path, into: Path) -> Path:
    """A copy the run may change; the default repository is built when missing."""
    if not source.is_dir():
        if source.resolve() != DEFAULT_REPOSITORY.resolve():
            raise SystemExit(f"soak: {source} is not a directory")
        tool = Path(sys.executable).parent / "tensord"
        subprocess.run([str(tool), "demo-repo", str(source)], check=True)
    copy = into / "models"
    shutil.copytree(source, copy)
    return copy


def change_repository(repository: Path) -> list[str]:
    """What the reload picks up: one model file replaced (new inode), one model added."""
    models = sorted(p for p in repository.iterdir() if p.is_dir())
    changed = models[0]
    done = []
    for path in sorted(changed.rglob("*.onnx")):
        staging = path.with_name(path.name + ".staging")
        shutil.copy2(path, staging)
        os.replace(staging, path)
        done.append(f"replaced {path.relative_to(repository)}")
    added = repository / f"{changed.name}_added"
    shutil.copytree(changed, added)
    done.append(f"added {added.name}")
    return done


def leaks(info: pb.InfoResponse) -> dict[str, Any]:
    """Per model: pool bytes still in use, runs queued or running, KV figures if reported."""
    found: dict[str, Any] = {}
    for m in info.models:
        status = m.executor_status
        entry: dict[str, Any] = {
            "pool_in_use_bytes": {p.name: p.in_use_bytes for p in status.pools},
            "queued": status.queue_depth,
            "running": status.running,
        }
        if m.HasField("generator"):
            g = m.generator
            entry["kv"] = {
                "used_blocks": g.kv_cache.used_blocks,
                "free_blocks": g.kv_cache.free_blocks,
                "total_blocks": g.kv_cache.total_blocks,
                "running": g.running,
                "waiting": g.waiting,
            }
        found[f"{m.name} v{m.version}"] = entry
    return found


def leaked(report: dict[str, Any]) -> list[str]:
    """Anything still held once the load has stopped."""
    problems = []
    for model, entry in report.items():
        for pool, used in entry["pool_in_use_bytes"].items():
            if used:
                problems.append(f"{model}: {pool} pool holds {used} bytes")
        if entry["queued"] or entry["running"]:
            problems.append(f"{model}: {entry['queued']} queued, {entry['running']} running")
        kv = entry.get("kv")
        if kv and (kv["used_blocks"] or kv["running"] or kv["waiting"]):
            problems.append(
                f"{model}: KV cache holds {kv['used_blocks']} blocks "
                f"({kv['running']} running, {kv['waiting']} waiting)"
            )
    return problems


async def soak(args: argparse.Namespace, pid: int, target: str, notify: NotifyListener,
               repository: Path) -> dict[str, Any]:  # fmt: skip
    duration = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(60.0, duration * 0.2)
    load = SoakLoad(target, args.seed, Mix())
    samples: list[tuple[float, int]] = []
    done = asyncio.Event()
    start = time.monotonic()
    sampler = asyncio.create_task(sample_rss(pid, 1.0, samples, done))
    runner = asyncio.create_task(load.run(args.in_flight))
    await asyncio.sleep(warmup)
    baseline = samples[-1][1]
    await asyncio.sleep(max(0.0, duration / 2 - warmup))
    reload = await do_reload(pid, notify, repository)
    async with grpc_channel(target) as stub:
        await load.refresh(stub)
    await asyncio.sleep(max(0.0, start + duration - time.monotonic()))
    load.stop.set()
    await runner
    await asyncio.sleep(1.0)  # let cancelled work unwind
    done.set()
    await sampler
    final = samples[-1][1]
    async with grpc_channel(target) as stub:
        info = await stub.Info(pb.InfoRequest())
    report = leaks(info)
    return {
        "duration_s": round(time.monotonic() - start, 1),
        "warmup_s": warmup,
        "rss": {
            "baseline_bytes": baseline,
            "final_bytes": final,
            "max_bytes": max(s[1] for s in samples),
            "growth_percent": round((final - baseline) / baseline * 100, 2),
            "samples": [(round(t - start, 1), r) for t, r in samples],
        },
        "reload": reload,
        "generate": "ran" if load.generators else "skipped: no generator model is served",
        "calls_by_kind_and_status": {f"{k} {s}": n for (k, s), n in load.tally.counts.items()},
        "calls_by_status": load.tally.by_status(),
        "unexpected": load.tally.unexpected_count(),
        "unexpected_examples": load.tally.unexpected,
        "tokens": load.tally.tokens,
        "leaks": report,
        "leaked": leaked(report),
    }


@contextlib.asynccontextmanager
async def grpc_channel(target: str) -> AsyncIterator[pb_grpc.InferenceServiceStub]:
    """A stub on a fresh channel, closed afterwards."""
    async with grpc.aio.insecure_channel(target) as channel:
        yield pb_grpc.InferenceServiceStub(channel)


async def do_reload(pid: int, notify: NotifyListener, repository: Path) -> dict[str, Any]:
    changes = change_repository(repository)
    started = time.monotonic()
    os.kill(pid, signal.SIGHUP)
    await asyncio.to_thread(notify.wait_for, "RELOADING", 30)
    ready = await asyncio.to_thread(notify.wait_for, "READY", 120)
    return {
        "changes": changes,
        "seconds": round(time.monotonic() - started, 3),
        "status": ready.get("STATUS", ""),
    }


def render(result: dict[str, Any], target: float) -> tuple[str, bool]:
    rss = result["rss"]
    lines = [
        f"soak: {result['duration_s']} s, warm-up {result['warmup_s']:.0f} s",
        f"  reload: {', '.join(result['reload']['changes'])} -> READY in "
        f"{result['reload']['seconds']} s ({result['reload']['status']})",
        f"  Generate: {result['generate']}",
        f"  RSS: {rss['baseline_bytes'] / 2**20:.1f} MiB after warm-up, "
        f"{rss['final_bytes'] / 2**20:.1f} MiB at the end, max {rss['max_bytes'] / 2**20:.1f} "
        f"MiB: growth {rss['growth_percent']:+.2f}% (target < {target}%)",
        "  calls by kind and status:",
    ]
    for key, n in sorted(result["calls_by_kind_and_status"].items()):
        lines.append(f"    {key:<40} {n:>8,}")
    lines.append(f"  by status: {json.dumps(result['calls_by_status'], sort_keys=True)}")
    lines.append(f"  unexpected errors: {result['unexpected']}")
    lines += [f"    {e}" for e in result["unexpected_examples"][:10]]
    lines.append(f"  leaked after the load: {result['leaked'] or 'nothing'}")
    ok = not result["unexpected"] and not result["leaked"] and rss["growth_percent"] < target
    lines.append(f"  {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_signals()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with tempfile.TemporaryDirectory(prefix="tensord-soak-") as tmp, ProcessGroup() as procs:
        repository = stage_repository(args.model_repository, Path(tmp))
        notify = NotifyListener()
        port = free_port(HOST)
        log_path = RESULTS_DIR / f"soak-{stamp}.log"
        with log_path.open("w") as log:
            argv_ = tensord_command(repository, f"{HOST}:{port}", "info")
            proc = procs.start(argv_, stdout=log, stderr=subprocess.STDOUT,
                               env=notify.env(PYTHONUNBUFFERED="1"))  # fmt: skip
        try:
            wait_for_port(HOST, port, proc, 60)
            notify.wait_for("READY", 300)
            result = asyncio.run(soak(args, proc.pid, f"{HOST}:{port}", notify, repository))
        finally:
            notify.close()
        result["daemon_exit"] = procs.stop(proc)
    result["machine"] = machine_info(REPO)
    result["settings"] = {k: str(v) for k, v in vars(args).items()}
    out = RESULTS_DIR / f"soak-{stamp}.json"
    out.write_text(json.dumps(result, indent=2))
    text, ok = render(result, args.rss_target)
    print(text)
    print(f"  results: {out.relative_to(REPO)}, daemon log: {log_path.relative_to(REPO)}")
    return 0 if ok and result["daemon_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
