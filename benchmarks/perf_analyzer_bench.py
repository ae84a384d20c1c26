"""Triton's perf_analyzer against tensord's Open Inference Protocol service, beside the
project's own load generator on tensord.v1, in one run on one daemon.

perf_analyzer (PyPI `perf-analyzer`) is built against glibc 2.38, and Debian 12 has 2.36
(pip there quietly picks an empty placeholder release). So it runs inside a Debian 13
(trixie) sysroot made with debootstrap in build/trixie: the sysroot shares the host's
network, so it reaches the daemon on 127.0.0.1. Making the sysroot needs root, debootstrap
and Debian's mirror once (about 3 minutes); later runs reuse it.

    python benchmarks/perf_analyzer_bench.py [--model mlp] [--concurrency 1 8 32]

For each concurrency: perf_analyzer's throughput and p50/p99 latency (its own measurement
windows, batch 1, random data), then the project's load generator's over a window of the
same length, both on the same daemon and model.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import use_venv
from machine import write_results
from point import LoadSpec, measure
from procs import ProcessGroup, exit_on_signals
from servers import Server, start_tensord

REPO = use_venv.REPO
SYSROOT = REPO / "build" / "trixie"
MIRROR = "http://deb.debian.org/debian"
PA_VENV = "/opt/perf-analyzer"
PA_PACKAGE = "perf-analyzer>=2.60,<3"
WINDOW_S = 3.0


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, **kwargs)


def _in_sysroot(sysroot: Path, *argv: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return _run(["chroot", str(sysroot), *argv], **kwargs)


def why_no_sysroot() -> str | None:
    """Why a sysroot cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "making and entering a sysroot (debootstrap, chroot) needs root"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (apt-get install debootstrap)"
    return None


def ensure_perf_analyzer(sysroot: Path) -> Path:
    """The sysroot with perf_analyzer installed (made on first use); its path inside."""
    binary = Path(PA_VENV) / "bin" / "perf_analyzer"
    if (sysroot / binary.relative_to("/")).exists():
        return binary
    if not (sysroot / "usr" / "bin" / "python3").exists():
        print(f"making a Debian 13 sysroot in {sysroot} (debootstrap, a few minutes)", flush=True)
        _run([
            "debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
            "trixie", str(sysroot), MIRROR,
        ])  # fmt: skip
    # The wheel is fetched by the host's pip (its index and certificates), for the
    # sysroot's platform, and installed there offline.
    wheels = sysroot / "tmp" / "perf-analyzer-wheels"
    _run([
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
        "--platform", "manylinux_2_38_x86_64", "--python-version", "3.13", "-d", str(wheels),
        PA_PACKAGE,
    ])  # fmt: skip
    _in_sysroot(sysroot, "python3", "-m", "venv", PA_VENV)
    _in_sysroot(
        sysroot, f"{PA_VENV}/bin/pip", "install", "-q", "--no-index",
        "--find-links", "/tmp/perf-analyzer-wheels", PA_PACKAGE,
    )  # fmt: skip
    if not (sysroot / binary.relative_to("/")).exists():
        raise RuntimeError(f"{PA_PACKAGE} installed no {binary} in the sysroot")
    return binary


def _mounted(sysroot: Path) -> list[Path]:
    """/proc and /dev inside the sysroot, for perf_analyzer's run; unmount them after."""
    points = []
    for source, kind in (("/proc", "proc"), ("/dev", "bind")):
        target = sysroot / source.lstrip("/")
        target.mkdir(exist_ok=True)
        if kind == "proc":
            _run(["mount", "-t", "proc", "proc", str(target)])
        else:
            _run(["mount", "--bind", source, str(target)])
        points.append(target)
    return points


def perf_analyzer(sysroot: Path, binary: Path, target: str, model: str, n: int) -> dict[str, Any]:
    """One perf_analyzer run at `n` requests in flight: its client-side infer/s and latency
    percentiles, read from what it prints. (-x: perf_analyzer matches the server's
    statistics by version and finds none for the default "".)"""
    argv = [
        str(binary), "-m", model, "-x", "1", "-i", "grpc", "-u", target, "-b", "1",
        "--concurrency-range", f"{n}:{n}", "--measurement-interval", str(int(WINDOW_S * 1000)),
        "--percentile", "99",
    ]  # fmt: skip
    done = _in_sysroot(sysroot, *argv, capture_output=True, timeout=300)
    client = done.stdout.rsplit("Request concurrency:", 1)[-1].split("Server:", 1)[0]
    found = {
        key: re.search(pattern, client)
        for key, pattern in (
            ("infer_per_s", r"Throughput: ([0-9.]+) infer/sec"),
            ("p50_us", r"p50 latency: ([0-9.]+) usec"),
            ("p99_us", r"p99 latency: ([0-9.]+) usec"),
        )
    }
    if not all(found.values()):
        raise RuntimeError(f"perf_analyzer measured nothing; it said:\n{done.stdout[-3000:]}")
    result = {"concurrency": n, **{k: float(m.group(1)) for k, m in found.items() if m}}
    server = done.stdout.rsplit("Server:", 1)[-1]
    times = re.search(
        r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec"
        r".*compute infer (\d+) usec",
        server,
    )
    if times:  # the server's own statistics (ModelStatistics), as perf_analyzer reads them
        keys = ("server_request_us", "server_overhead_us", "server_queue_us", "server_compute_us")
        result.update(zip(keys, map(float, times.groups()), strict=True))
    return result


def own_loadgen(procs: ProcessGroup, server: Server, n: int) -> dict[str, Any]:
    """The project's load generator on tensord.v1 Predict at `n` in flight."""
    spec = LoadSpec(n, "aio", 1, 1.0, WINDOW_S, 10.0)
    result = measure(procs, server, spec, [])
    latency = result["latency_us"] or {}
    return {
        "concurrency": n,
        "infer_per_s": result["rps"],
        "p50_us": latency.get("p50"),
        "p99_us": latency.get("p99"),
        "errors": result["errors"],
    }


def _table(pa: list[dict[str, Any]], own: list[dict[str, Any]]) -> str:
    lines = [
        "| in flight | perf_analyzer infer/s | p50 ms | p99 ms | loadgen req/s | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a, b in zip(pa, own, strict=True):
        lines.append(
            f"| {a['concurrency']} | {a['infer_per_s']:,.0f} | {a['p50_us'] / 1e3:.2f} | "
            f"{a['p99_us'] / 1e3:.2f} | {b['infer_per_s']:,.0f} | {(b['p50_us'] or 0) / 1e3:.2f} "
            f"| {(b['p99_us'] or 0) / 1e3:.2f} |"
        )
    served = [a for a in pa if "server_request_us" in a]
    if served:
        lines += [
            "",
            "The daemon's own statistics (ModelStatistics), as perf_analyzer reports them, µs",
            "per request:",
            "",
            "| in flight | in the daemon | overhead | queue | compute |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {a['concurrency']} | {a['server_request_us']:.0f} | "
            f"{a['server_overhead_us']:.0f} | {a['server_queue_us']:.0f} | "
            f"{a['server_compute_us']:.0f} |"
            for a in served
        ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repository", type=Path, default=REPO / "build" / "demo-models")
    parser.add_argument("--sysroot", type=Path, default=SYSROOT)
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    why = why_no_sysroot()
    if why is not None:
        print(f"perf_analyzer: not run: {why}")
        return 0
    binary = ensure_perf_analyzer(args.sysroot)
    started = datetime.now(UTC)
    exit_on_signals()
    pa, own = [], []
    with ProcessGroup() as procs, open(os.devnull, "w") as log:
        server = start_tensord(procs, args.repository, log)
        time.sleep(2.0)  # models load; perf_analyzer asks ModelReady first
        mounts = _mounted(args.sysroot)
        try:
            for n in args.concurrency:
                pa.append(perf_analyzer(args.sysroot, binary, server.target, args.model, n))
                own.append(own_loadgen(procs, server, n))
        finally:
            for point in reversed(mounts):
                subprocess.run(["umount", "-l", str(point)], check=False)
    print(_table(pa, own))
    body = {"model": args.model, "perf_analyzer": pa, "loadgen": own}
    write_results(REPO, args.results_dir, "perf_analyzer", started, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
