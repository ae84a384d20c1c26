"""Where a server's time goes under the benchmark's load: CPU per thread, and stacks.

    python benchmarks/daemon_profile.py [--concurrency 1,32] [--duration 5] [--py-spy]
                                        [--server tensord|echo] [--model-repository DIR]

It drives the server exactly as predict_bench.py does (same load generator, same
bytes) and, over the measurement window, reads every server thread's user/system CPU
and context switches from /proc: the event loop (MainThread), the model's runner lanes,
grpc's poller and its C++ threads (Python threads are named through `py-spy dump` when
py-spy is installed). With --py-spy it also samples Python stacks at 100 Hz without
stopping the server (--nonblocking). Sampling costs CPU on a small host, so rates read lower than in
predict_bench.py; compare shares, not absolutes. Results: benchmarks/results/
profile-<timestamp>.json (thread table, collapsed stacks) and a printed summary.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# use_venv comes first: it re-runs this script under .venv when grpcio/tensord are missing.
import use_venv
from cpustat import ThreadCpu, thread_cpu
from point import LoadSpec, measure
from procs import ProcessGroup, exit_on_signals
from servers import Server, start_echo, start_tensord
from stacks import parse, render

REPO = use_venv.REPO
_DUMP_THREAD = re.compile(r'^Thread (\d+) \([^)]*\): "(.*)"')


def find_py_spy() -> str | None:
    """py-spy beside this interpreter (the project's venv), or on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def python_thread_names(py_spy: str, pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name, from `py-spy dump` (empty when it fails)."""
    done = subprocess.run(
        [py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
    )
    names = {}
    for line in done.stdout.splitlines():
        match = _DUMP_THREAD.match(line)
        if match:
            names[int(match.group(1))] = match.group(2)
    return names


class Profiler:
    """A WindowObserver: thread CPU at the window's edges, py-spy record in between."""

    def __init__(self, py_spy: str | None, workdir: Path, sample: bool) -> None:
        self.py_spy = py_spy
        self.sample = sample and py_spy is not None
        self.workdir = workdir
        self.before: dict[int, ThreadCpu] = {}
        self.after: dict[int, ThreadCpu] = {}
        self.names: dict[int, str] = {}
        self.stacks: list[str] = []
        self._pid = 0
        self._record: subprocess.Popen[str] | None = None
        self._output = workdir / "stacks.txt"

    def window_started(self, server: Server, duration_s: float) -> None:
        """Snapshot the threads; start sampling for the window's length."""
        self._pid = server.pid
        self.before = thread_cpu(server.pid)
        if self.sample and self.py_spy:
            argv = [self.py_spy, "record", "--pid", str(server.pid), "--rate", "100"]
            argv += ["--duration", str(max(1, int(duration_s))), "--format", "raw"]
            argv += ["--threads", "--nonblocking", "--output", str(self._output)]
            self._record = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )

    def window_ended(self) -> None:
        """Snapshot the threads; collect the samples and the thread names."""
        self.after = thread_cpu(self._pid)
        if self._record is not None:
            _, err = self._record.communicate(timeout=60)
            if self._output.exists():
                self.stacks = self._output.read_text().splitlines()
            elif err:
                print(f"py-spy: {err.strip()}", file=sys.stderr)
        if self.py_spy:  # a dump names the Python threads (the OS sees them all as one name)
            self.names = python_thread_names(self.py_spy, self._pid)


def thread_table(profiler: Profiler, pid: int, ok: int, window_s: float) -> list[dict[str, Any]]:
    """Per thread: role, CPU per request (user, system), cores, switches per request."""
    rows: list[dict[str, Any]] = []
    for tid, end in profiler.after.items():
        start = profiler.before.get(tid, ThreadCpu(end.name, 0.0, 0.0, 0))
        user, system = end.user_s - start.user_s, end.system_s - start.system_s
        if user + system <= 0 and end.switches == start.switches:
            continue
        name = profiler.names.get(tid, end.name)
        if tid == pid:
            name = f"{name} (event loop)"
        rows.append(
            {
                "tid": tid,
                "thread": name,
                "user_us_per_req": user / ok * 1e6 if ok else None,
                "system_us_per_req": system / ok * 1e6 if ok else None,
                "cores": (user + system) / window_s,
                "switches_per_req": (end.switches - start.switches) / ok if ok else None,
            }
        )
    rows.sort(key=lambda r: -r["cores"])
    return rows


def format_threads(rows: list[dict[str, Any]]) -> list[str]:
    """The thread table as text."""
    lines = [f"  {'thread':<34} {'user':>7} {'sys':>6} {'cores':>6} {'switches':>9}"]
    lines.append(f"  {'':<34} {'us/req':>7} {'us/req':>6} {'':>6} {'per req':>9}")
    for r in rows:
        lines.append(
            f"  {r['thread'][:34]:<34} {r['user_us_per_req']:>7.0f} "
            f"{r['system_us_per_req']:>6.0f} {r['cores']:>6.2f} {r['switches_per_req']:>9.2f}"
        )
    return lines


def main() -> int:
    """Profile each concurrency, print the summary, write the JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,32", help="comma-separated (1,32)")
    parser.add_argument("--duration", type=float, default=5.0, help="window, seconds (5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before (1)")
    parser.add_argument("--server", choices=["tensord", "echo"], default="tensord")
    parser.add_argument("--py-spy", action="store_true", help="also sample Python stacks")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-call deadline, s")
    parser.add_argument("--model-repository", type=Path, default=REPO / "build" / "demo-models")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    py_spy = find_py_spy()
    if args.py_spy and py_spy is None:
        parser.error("--py-spy: py-spy not found; `.venv/bin/pip install py-spy`")
    exit_on_signals()
    stamp = datetime.now(UTC)
    report: dict[str, Any] = {"started_at": stamp.isoformat(timespec="seconds"), "points": []}
    with (
        ProcessGroup() as procs,
        tempfile.TemporaryDirectory() as tmp,
        tempfile.TemporaryFile("w+") as log,
    ):
        server = (
            start_tensord(procs, args.model_repository.resolve(), log)
            if args.server == "tensord"
            else start_echo(procs)
        )
        for concurrency in concurrencies:
            profiler = Profiler(py_spy, Path(tmp), sample=args.py_spy)
            spec = LoadSpec(
                concurrency,
                "sync" if concurrency == 1 else "aio",
                1,
                args.warmup,
                args.duration,
                args.timeout,
            )
            m = measure(procs, server, spec, [], profiler)
            rows = thread_table(profiler, server.pid, m["ok"], m["window_s"])
            per_req = m["cpu_per_request"]
            print(
                f"\n{server.name} @ {concurrency} in flight: {m['rps']:,.0f} req/s, "
                f"p50 {m['latency_us']['p50'] / 1e3:.2f} ms; server "
                f"{per_req['server_us']:,.0f} us CPU/req, client {per_req['client_us']:,.0f}"
            )
            print("\n".join(format_threads(rows)))
            if profiler.stacks:
                print("  py-spy, on-CPU samples by thread:")
                print("\n".join("  " + line for line in render(parse(profiler.stacks))))
            report["points"].append({"measurement": m, "threads": rows, "stacks": profiler.stacks})
    out = REPO / "benchmarks" / "results" / f"profile-{stamp:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nresults: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
