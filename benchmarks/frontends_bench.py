"""What `[server] frontends` costs and buys: CPU per request by process, latency, scaling.

    python benchmarks/frontends_bench.py [--quick] [--concurrency 32,64] [--connections 8]
    python benchmarks/frontends_bench.py --scaling [--quick] [--frontends 1,2,4]

Every server answers batch-1 Predict calls to a null model (`null_model.py`: one ONNX Add
on a float32 [1, 16] input, a few µs of ONNX Runtime), so the servers' own work is what
is measured. In one run, with the same load generator (`loadgen.py`, its calls spread
over several TCP connections, since SO_REUSEPORT balances connections, not calls):

  echo      `echo_server.py`: grpcio alone, fixed reply bytes (the transport limit)
  floor     `floor_server.py`: a bare grpc.aio server running the null model on a pool
  tensord   `tensord serve` with frontends = 0 (one process), 1 and 2

The default run measures each at `--concurrency` calls in flight: requests/s and the CPU
time (user + system, /proc) of each process over the window divided by the requests
served in it: the supervisor, the engine, each frontend, the one-process daemon, the echo
and floor servers, the clients. The daemons also serve `null_batched` (the same model
with [dynamic_batching]); its mean batch size comes from Info's batch counters over the
window. Then p50 latency at 1 call in flight (one connection, the blocking client) of one
frontend against one process. Targets, printed as ratios, not asserted:
  frontend CPU per request (summed over frontends) <= floor server's + 40 µs
  engine CPU per request <= 30 µs (null), <= 10 µs (null_batched)
  p50 at 1 in flight, frontends = 1 / one process <= 1.1

--scaling pins the daemons to the first half of the usable cores and the load generators
to the other half (the affinity is set on the daemon and its children inherit it), and
runs frontends = N for each N of --frontends with 32 N calls in flight over 8 N
connections: throughput per N against N x the one-frontend figure (target >= 0.8), and
the batched model's mean batch size against the one-process daemon at the same load. On a
host with fewer than 16 cores it says so and runs with what it has.

Results go to benchmarks/results/frontends-<timestamp>.json; everything started is
stopped on exit, Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

# use_venv comes first: it re-runs this script under .venv when grpcio/tensord are missing.
import use_venv
from machine import write_results
from null_model import FEATURES, NULL, NULL_BATCHED
from point import LoadSpec, measure
from procs import ProcessGroup, exit_on_signals, pid_alive, python_script, read_line
from servers import Server, log_events, start_echo, start_floor, start_tensord, supervised_children

from tensord_client import Client

REPO = use_venv.REPO
RESULTS_DIR = REPO / "benchmarks" / "results"

FRONTEND_OVER_FLOOR_US = 40.0
"""Target: frontend CPU per Predict at most the floor server's plus this."""
ENGINE_US = {NULL: 30.0, NULL_BATCHED: 10.0}
"""Target: engine CPU per request with the null model, unbatched and batched."""
LATENCY_RATIO = 1.1
"""Target: p50 at 1 in flight, one frontend over one process."""
SCALING_RATIO = 0.8
"""Target: throughput with N frontends over N x the one-frontend figure."""
SCALING_CORES = 16
"""The host the scaling figures are meant for."""
IN_FLIGHT_PER_FRONTEND = 32
CONNECTIONS_PER_FRONTEND = 8
_READY_TIMEOUT_S = 150.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; --quick shortens every window."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, help="seconds measured per point (3; quick 1.5)")
    parser.add_argument("--warmup", type=float, help="seconds of load before each window (1)")
    parser.add_argument("--quick", action="store_true", help="1.5 s windows, 0.5 s warm-ups")
    parser.add_argument(
        "--concurrency", default="32,64", help="calls in flight, comma-separated (32,64)"
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=8,
        help="TCP connections the calls spread over (8; at least 4 for the targets)",
    )
    parser.add_argument(
        "--frontend-counts",
        default="1,2",
        help="frontends of the supervised daemons beside the one-process one (1,2)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="windows per point; the median counts (1)"
    )
    parser.add_argument(
        "--client-procs", type=int, default=1, help="load generator processes per point (1)"
    )
    parser.add_argument(
        "--batch-delay-us",
        type=int,
        default=0,
        help="null_batched's max_queue_delay_microseconds (0: joins whatever is queued)",
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="the scaling run: daemons on the first half of the cores, load on the other",
    )
    parser.add_argument(
        "--frontends", default="1,2,4", help="with --scaling: frontend counts N (1,2,4)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="per-call deadline sent, s; 0: none (30)"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    args.duration = args.duration or (1.5 if args.quick else 3.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    try:
        args.concurrency = _numbers(args.concurrency)
        args.frontend_counts = _numbers(args.frontend_counts)
        args.frontends = _numbers(args.frontends)
    except ValueError as exc:
        parser.error(str(exc))
    if min(args.concurrency) < 1 or min(args.frontends) < 1 or min(args.frontend_counts) < 1:
        parser.error("--concurrency, --frontends, --frontend-counts: every value must be >= 1")
    if args.connections < 1 or args.repeat < 1 or args.client_procs < 1:
        parser.error("--connections, --repeat, --client-procs: must be >= 1")
    return args


def _numbers(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values:
        raise ValueError(f"expected numbers like 1,2,4, got {text!r}")
    return values


# ------------------------------------------------------------------ the servers


def ort_null(procs: ProcessGroup, repository: Path, batch_delay_us: int) -> dict[str, Any]:
    """Write the null repository and time ONNX Runtime on it, in a process of its own
    while no server of ours runs."""
    argv = python_script("null_model.py", str(repository), "--measure")
    argv += ["--batch-delay-us", str(batch_delay_us)]
    proc = procs.start(argv)
    try:
        report: dict[str, Any] = json.loads(read_line(proc, 120.0))
    finally:
        procs.stop(proc)
    return report


@dataclass
class Daemon:
    """A tensord under test and its log file."""

    server: Server
    frontends: int
    log: IO[str]

    @property
    def label(self) -> str:
        """`1 process` or `N frontend(s)`."""
        if not self.frontends:
            return "1 process"
        return f"{self.frontends} frontend" + ("s" if self.frontends > 1 else "")

    def affinity(self) -> dict[str, list[int]]:
        """The cores each of its processes may run on, now."""
        top = "supervisor" if self.frontends else "daemon"
        cores = {}
        for role, pid in [(top, self.server.pid), *self.server.parts]:
            try:
                cores[role] = sorted(os.sched_getaffinity(pid))
            except OSError:
                cores[role] = []
        return cores

    def stop(self, procs: ProcessGroup) -> dict[str, Any]:
        """SIGTERM (the daemon drains), then its exit status and whether every process of
        it is gone."""
        code = procs.stop(self.server.proc)
        time.sleep(0.2)
        left = [role for role, pid in self.server.parts if pid_alive(pid)]
        return {"exit_code": code, "processes_left": left}

    def describe(self) -> dict[str, Any]:
        """What the results file says of it."""
        return {
            "frontends": self.frontends,
            "label": self.label,
            "command": self.server.proc.args,
            "pid": self.server.pid,
            "children": dict(self.server.parts),
            "affinity": self.affinity(),
        }


def start_daemon(
    procs: ProcessGroup,
    stack: ExitStack,
    repository: Path,
    frontends: int,
    cpus: list[int] | None = None,
) -> Daemon:
    """`tensord serve` with `frontends`, JSON logs at info (the supervisor names its
    children there) into a file of its own."""
    log = stack.enter_context(tempfile.TemporaryFile("w+"))  # noqa: SIM115 - the stack closes it
    name = "tensord" if not frontends else f"tensord-f{frontends}"
    server = start_tensord(
        procs, repository, log, "info", frontends=frontends, name=name, cpus=cpus
    )
    return Daemon(server, frontends, log)


def wait_until_ready(procs: ProcessGroup, server: Server) -> None:
    """Block until the server answers Predict on the null model."""
    argv = python_script(
        "loadgen.py",
        "--target",
        server.target,
        "--ready-only",
        "--model",
        NULL,
        "--features",
        str(FEATURES),
    )
    proc = procs.start(argv)
    try:
        line = read_line(proc, _READY_TIMEOUT_S).strip()
        if line != "READY":
            raise RuntimeError(f"{server.name} readiness probe said {line!r}")
    finally:
        procs.stop(proc)


# ------------------------------------------------------- what is read at the edges


def frontend_connections(server: Server) -> dict[str, int]:
    """Established connections on the server's port that each frontend holds now."""
    inodes = _established_inodes(int(server.target.rpartition(":")[2]))
    return {
        role: _sockets_held(pid, inodes)
        for role, pid in server.parts
        if role.startswith("frontend")
    }


def _established_inodes(port: int) -> set[str]:
    """The socket inodes of the established TCP connections on local `port`."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local address is HEX_IP:HEX_PORT; state 01 is ESTABLISHED.
            if int(fields[1].rpartition(":")[2], 16) == port and fields[3] == "01":
                inodes.add(fields[9])
    return inodes


def _sockets_held(pid: int, inodes: set[str]) -> int:
    """How many of the sockets `inodes` process `pid` has open (0 once it is gone)."""
    held = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                held += 1
    except OSError:
        pass
    return held


def batch_counters(target: str, model: str) -> dict[str, int] | None:
    """The model's dynamic batching counters from Info (None when it does not batch)."""
    client = Client(target, timeout=10.0, retries=0)
    try:
        for m in client.info().models:
            if m.name == model and m.proto.HasField("dynamic_batching"):
                b = m.dynamic_batching
                return {"batches": b.batches, "requests": b.requests, "rows": b.rows}
    finally:
        client.close()
    return None


@dataclass
class EdgeReader:
    """Reads, at the window's edges, the batch counters of a batched model and the
    connections each frontend holds (WindowObserver)."""

    model: str
    before: dict[str, int] | None = None
    after: dict[str, int] | None = None
    connections: dict[str, int] = field(default_factory=dict)
    _server: Server | None = None

    def window_started(self, server: Server, duration_s: float) -> None:
        """Counters and connections at the window's start."""
        self._server = server
        if server.parts:
            self.connections = frontend_connections(server)
        if self.model == NULL_BATCHED and server.name.startswith("tensord"):
            self.before = batch_counters(server.target, self.model)

    def window_ended(self) -> None:
        """Counters at the window's end."""
        if self.before is not None and self._server is not None:
            self.after = batch_counters(self._server.target, self.model)

    def batching(self) -> dict[str, Any] | None:
        """Batches, requests and rows run during the window, and the mean batch size."""
        if self.before is None or self.after is None:
            return None
        spent = {k: self.after[k] - self.before[k] for k in self.before}
        mean = spent["rows"] / spent["batches"] if spent["batches"] else None
        return {**spent, "mean_batch": mean}


# ------------------------------------------------------------------ measuring


def one_point(
    procs: ProcessGroup,
    server: Server,
    spec: LoadSpec,
    idle: list[Server],
    repeat: int,
) -> dict[str, Any]:
    """`repeat` windows of `spec` on `server`; the median by rate (by p50 at 1 in flight)
    counts, all rates kept."""
    runs = []
    for _ in range(repeat):
        edges = EdgeReader(spec.model)
        print(
            f"  {server.name:<11} {spec.model:<12} {spec.concurrency:>3} in flight, "
            f"{spec.connections} conn ...",
            end="",
            flush=True,
        )
        m = measure(procs, server, spec, idle, edges)
        m["model"] = spec.model
        m["frontend_connections"] = edges.connections
        m["batching"] = edges.batching()
        runs.append(m)
        p50 = m["latency_us"]["p50"] if m["latency_us"] else float("nan")
        print(f" {m['rps']:>8,.0f} req/s, p50 {p50 / 1e3:.2f} ms", flush=True)
    if spec.concurrency == 1:
        ordered = sorted(runs, key=_p50)
    else:
        ordered = sorted(runs, key=lambda m: float(m["rps"]))
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs_rps"] = [m["rps"] for m in runs]
    chosen["runs_p50_us"] = [_p50(m) for m in runs]
    return chosen


def _p50(m: dict[str, Any]) -> float:
    return float(m["latency_us"]["p50"]) if m["latency_us"] else float("inf")


def roles(m: dict[str, Any]) -> dict[str, float | None]:
    """µs of CPU per request by role: frontends (summed), engine, supervisor, daemon (one
    process), server (echo, floor), client."""
    per = m["cpu_per_request"]
    fronts = [v for k, v in per.items() if k.startswith("frontend.") and v is not None]
    supervised = "engine_us" in per
    is_daemon = m["server"].startswith("tensord")
    return {
        "frontends": sum(fronts) if fronts else None,
        "engine": per.get("engine_us"),
        "supervisor": per["server_us"] if supervised else None,
        "daemon": per["server_us"] if is_daemon and not supervised else None,
        "server": per["server_us"] if not is_daemon else None,
        "client": per["client_us"],
    }


def spec_for(args: argparse.Namespace, concurrency: int, model: str, **kw: Any) -> LoadSpec:
    """The load of one point: `concurrency` over the connections (one and the blocking
    client at 1 in flight), the null model's request."""
    single = concurrency == 1
    return LoadSpec(
        concurrency=concurrency,
        client="sync" if single else "aio",
        client_procs=kw.pop("client_procs", 1 if single else args.client_procs),
        warmup_s=args.warmup,
        duration_s=args.duration,
        timeout_s=args.timeout,
        connections=kw.pop("connections", 1 if single else args.connections),
        model=model,
        features=FEATURES,
        **kw,
    )


def daemon_log_notes(daemons: list[Daemon]) -> dict[str, list[dict[str, Any]]]:
    """Each daemon's log lines at warning and above (its stop included), and any child it
    restarted."""
    notes = {}
    for d in daemons:
        events = log_events(d.log)
        odd = [e for e in events if e.get("level") in ("warning", "error", "critical")]
        if d.frontends and supervised_children(events) != sorted(d.server.parts):
            odd.append({"event": "bench.children_changed", "now": supervised_children(events)})
        notes[d.server.name] = odd
    return notes


# ------------------------------------------------------------ the default run


def run_default(
    args: argparse.Namespace, procs: ProcessGroup, stack: ExitStack, repo: Path
) -> dict[str, Any]:
    """Echo, floor and the daemons at each concurrency, then the latency check."""
    print("starting the echo and floor servers and the daemons ...", flush=True)
    echo = start_echo(procs, "--model", NULL, "--features", str(FEATURES))
    floor = start_floor(procs, repo, "--model", NULL)
    daemons = [start_daemon(procs, stack, repo, n) for n in [0, *args.frontend_counts]]
    servers = [echo, floor, *(d.server for d in daemons)]
    for server in servers:
        wait_until_ready(procs, server)
    points = []
    for concurrency in args.concurrency:
        pairs = [(s, NULL) for s in servers] + [(d.server, NULL_BATCHED) for d in daemons]
        for server, model in pairs:
            idle = [s for s in servers if s is not server]
            spec = spec_for(args, concurrency, model)
            points.append(one_point(procs, server, spec, idle, args.repeat))
    latency = []
    for server in [echo, *(d.server for d in daemons)]:
        idle = [s for s in servers if s is not server]
        latency.append(one_point(procs, server, spec_for(args, 1, NULL), idle, args.repeat))
    described = {d.server.name: d.describe() for d in daemons}
    for d in daemons:
        described[d.server.name]["stopped"] = d.stop(procs)
    return {
        "daemons": described,
        "points": points,
        "latency": latency,
        "daemon_log": daemon_log_notes(daemons),
    }


# ------------------------------------------------------------- the scaling run


def core_halves() -> tuple[list[int], list[int]]:
    """(the daemons' cores, the load generators' cores): the usable cores split in two;
    with one core, both get it."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    return cores[:half], cores[half:] or cores


def run_scaling(
    args: argparse.Namespace, procs: ProcessGroup, stack: ExitStack, repo: Path
) -> dict[str, Any]:
    """frontends = N for each N, against one process at the same load, pinned."""
    server_cpus, load_cpus = core_halves()
    print(f"daemons on cores {server_cpus}, load generators on cores {load_cpus}", flush=True)
    single = start_daemon(procs, stack, repo, 0, server_cpus)
    wait_until_ready(procs, single.server)
    points = []
    daemons = [single]
    described = {single.server.name: single.describe()}
    for n in args.frontends:
        daemon = start_daemon(procs, stack, repo, n, server_cpus)
        daemons.append(daemon)
        wait_until_ready(procs, daemon.server)
        described[daemon.server.name] = daemon.describe()
        concurrency = IN_FLIGHT_PER_FRONTEND * n
        connections = CONNECTIONS_PER_FRONTEND * n
        client_procs = max(1, min(len(load_cpus), connections))
        for model in (NULL, NULL_BATCHED):
            spec = spec_for(
                args,
                concurrency,
                model,
                connections=connections,
                client_procs=client_procs,
                cpus=tuple(load_cpus),
            )
            for server, other in ((daemon.server, single.server), (single.server, daemon.server)):
                m = one_point(procs, server, spec, [other], args.repeat)
                m["scaling_n"] = n
                points.append(m)
        described[daemon.server.name]["stopped"] = daemon.stop(procs)
    described[single.server.name]["stopped"] = single.stop(procs)
    return {
        "server_cpus": server_cpus,
        "load_cpus": load_cpus,
        "daemons": described,
        "points": points,
        "daemon_log": daemon_log_notes(daemons),
    }


# ------------------------------------------------------------------- the tables


def _num(value: float | None, fmt: str = ",.0f") -> str:
    return format(value, fmt) if value is not None else "-"


def _ratio(value: float | None, limit: float | None) -> str:
    if value is None or not limit:
        return "-"
    return f"{value / limit:.2f}"


def _label(m: dict[str, Any], daemons: dict[str, Any]) -> str:
    return str(daemons[m["server"]]["label"]) if m["server"] in daemons else m["server"]


def cpu_table(points: list[dict[str, Any]], daemons: dict[str, Any]) -> list[str]:
    """CPU µs per request by role at each point, with the targets as ratios."""
    head = (
        f"{'server':<12} {'model':<12} {'in fl':>5} {'conn':>4} {'req/s':>7} | "
        f"{'frontends':>9} {'engine':>7} {'superv':>7} {'daemon':>7} {'server':>7} "
        f"{'client':>7} | {'fe/(floor+40)':>13} {'eng/limit':>9} {'batch':>6} {'conn/fe':>8}"
    )
    rows = ["CPU per request (µs, user+sys over the window / requests in it)", head]
    rows.append("-" * len(head))
    floors = {p["concurrency"]: roles(p)["server"] for p in points if p["server"] == "floor"}
    for p in points:
        r = roles(p)
        floor = floors.get(p["concurrency"])
        fe_limit = floor + FRONTEND_OVER_FLOOR_US if floor is not None else None
        engine_limit = ENGINE_US.get(p["model"]) if r["engine"] is not None else None
        batching = p.get("batching") or {}
        conns = p.get("frontend_connections") or {}
        spread = "/".join(str(conns[k]) for k in sorted(conns)) if conns else "-"
        rows.append(
            f"{_label(p, daemons):<12} {p['model']:<12} {p['concurrency']:>5} "
            f"{p['connections']:>4} {p['rps']:>7,.0f} | {_num(r['frontends']):>9} "
            f"{_num(r['engine']):>7} {_num(r['supervisor'], ',.1f'):>7} {_num(r['daemon']):>7} "
            f"{_num(r['server']):>7} {_num(r['client']):>7} | "
            f"{_ratio(r['frontends'], fe_limit):>13} {_ratio(r['engine'], engine_limit):>9} "
            f"{_num(batching.get('mean_batch'), '.1f'):>6} {spread:>8}"
        )
    rows.append(
        f"targets: frontends <= floor + {FRONTEND_OVER_FLOOR_US:g} µs (ratio <= 1); engine <= "
        f"{ENGINE_US[NULL]:g} µs null, <= {ENGINE_US[NULL_BATCHED]:g} µs null_batched "
        "(ratio <= 1); batch: mean rows per batch in the window; conn/fe: connections each "
        "frontend held"
    )
    return rows


def latency_table(results: dict[str, Any]) -> list[str]:
    """p50/p99 at 1 in flight, and one frontend against one process."""
    daemons = results["daemons"]
    rows = ["", "1 call in flight (blocking client, one connection), null model"]
    rows.append(f"{'server':<12} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'/ 1 process':>11}")
    base = next(
        (_p50(p) for p in results["latency"] if daemons.get(p["server"], {}).get("frontends") == 0),
        None,
    )
    for p in results["latency"]:
        lat = p["latency_us"] or {}
        ratio = _p50(p) / base if base and p["server"] in daemons else None
        rows.append(
            f"{_label(p, daemons):<12} {p['rps']:>7,.0f} {_num(lat.get('p50', 0) / 1e3, '.3f'):>7} "
            f"{_num(lat.get('p99', 0) / 1e3, '.3f'):>7} {_num(ratio, '.2f'):>11}"
        )
    rows.append(f"target: 1 frontend / 1 process <= {LATENCY_RATIO:g}")
    return rows


def scaling_table(results: dict[str, Any]) -> list[str]:
    """Throughput per N against N x one frontend, and the mean batch against one process."""
    scaling = results["scaling"]
    by: dict[tuple[int, str, bool], dict[str, Any]] = {}
    for p in scaling["points"]:
        by[(p["scaling_n"], p["model"], p["server"] != "tensord")] = p
    one = by.get((1, NULL, True))
    head = (
        f"{'N':>2} {'in fl':>5} {'conn':>4} | {'null req/s':>10} {'/ N x N=1':>9} "
        f"{'1 process':>9} | {'batched req/s':>13} {'1 process':>9} | "
        f"{'mean batch':>10} {'1 process':>9} | {'conn/fe':>11}"
    )
    rows = [
        "",
        f"Scaling: daemons on cores {scaling['server_cpus']}, load on {scaling['load_cpus']}",
        head,
        "-" * len(head),
    ]
    for n in sorted({p["scaling_n"] for p in scaling["points"]}):
        fe, single = by[(n, NULL, True)], by[(n, NULL, False)]
        fe_b, single_b = by[(n, NULL_BATCHED, True)], by[(n, NULL_BATCHED, False)]
        ratio = fe["rps"] / (n * one["rps"]) if one and one["rps"] else None
        conns = fe.get("frontend_connections") or {}
        rows.append(
            f"{n:>2} {fe['concurrency']:>5} {fe['connections']:>4} | {fe['rps']:>10,.0f} "
            f"{_num(ratio, '.2f'):>9} {single['rps']:>9,.0f} | {fe_b['rps']:>13,.0f} "
            f"{single_b['rps']:>9,.0f} | {_mean_batch(fe_b):>10} {_mean_batch(single_b):>9} | "
            f"{'/'.join(str(conns[k]) for k in sorted(conns)) or '-':>11}"
        )
    rows.append(f"target: N frontends / (N x 1 frontend) >= {SCALING_RATIO:g}")
    cores = results["machine"]["usable_cores"]
    if cores < SCALING_CORES:
        rows.append(
            f"note: this host has {cores} usable cores, fewer than the {SCALING_CORES} the "
            "scaling target is set for; these figures show the mechanics, not the scaling"
        )
    return rows


def _mean_batch(m: dict[str, Any]) -> str:
    return _num((m.get("batching") or {}).get("mean_batch"), ".1f")


def log_lines(notes: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The daemons' warnings and errors, one line each."""
    out = []
    for name, events in notes.items():
        for e in events:
            out.append(f"  {name}: {json.dumps(e)}")
    return ["", "Daemon log, warnings and errors:", *out] if out else []


def warning_lines(points: list[dict[str, Any]]) -> list[str]:
    """Errors and windows with load from outside."""
    out = []
    for p in points:
        where = f"{p['server']} {p['model']} @ {p['concurrency']}"
        if p["errors"]:
            out.append(f"  {where}: errors {p['errors']}")
        if p["other_cpu_cores"] > 0.1:
            out.append(f"  {where}: {p['other_cpu_cores']:.2f} cores of other load")
    return ["", "Warnings:", *out] if out else []


def render(results: dict[str, Any]) -> str:
    """The summary printed at the end of a run."""
    s, m, ort = results["settings"], results["machine"], results["ort_null"]
    lines = [
        f"tensord frontends, null model (float32 [1, {FEATURES}] + 1): "
        f"{s['duration_s']:g} s per point after {s['warmup_s']:g} s warm-up; "
        f"{m['cpu_model']}, {m['usable_cores']} cores",
        f"ONNX Runtime in-process on `null`: {ort['batch1_us']:.1f} µs per batch-1 run, "
        f"{ort['batch64_us']:.1f} µs at batch 64",
        "",
    ]
    points = []
    notes: dict[str, list[dict[str, Any]]] = {}
    if "points" in results:
        lines += [*cpu_table(results["points"], results["daemons"]), *latency_table(results)]
        points += results["points"] + results["latency"]
        notes.update(results["daemon_log"])
    if "scaling" in results:
        scaling = results["scaling"]
        lines += [*cpu_table(scaling["points"], scaling["daemons"]), *scaling_table(results)]
        points += scaling["points"]
        notes.update(scaling["daemon_log"])
        for name, info in scaling["daemons"].items():
            for role, cores in info["affinity"].items():
                if cores != scaling["server_cpus"]:
                    notes.setdefault(name, []).append(
                        {"event": "bench.not_pinned", "role": role, "cores": cores}
                    )
    for section in (results, results.get("scaling", {})):
        for name, info in section.get("daemons", {}).items():
            stopped = info.get("stopped", {})
            if stopped.get("exit_code") or stopped.get("processes_left"):
                notes.setdefault(name, []).append({"event": "bench.unclean_stop", **stopped})
    lines += log_lines(notes) + warning_lines(points)
    return "\n".join(lines)


# ---------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the null repository, time ORT on it, then the chosen run."""
    body: dict[str, Any] = {
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "concurrency": args.concurrency,
            "connections": args.connections,
            "frontend_counts": args.frontend_counts,
            "repeat": args.repeat,
            "client_procs": args.client_procs,
            "batch_delay_us": args.batch_delay_us,
            "scaling": args.scaling,
            "frontends": args.frontends if args.scaling else None,
            "timeout_s": args.timeout,
            "targets": {
                "frontend_over_floor_us": FRONTEND_OVER_FLOOR_US,
                "engine_us": ENGINE_US,
                "latency_ratio": LATENCY_RATIO,
                "scaling_ratio": SCALING_RATIO,
            },
        }
    }
    with (
        tempfile.TemporaryDirectory(prefix="tensord-frontends-") as tmp,
        ProcessGroup() as procs,
        ExitStack() as stack,
    ):
        repo = Path(tmp) / "models"
        body["ort_null"] = ort_null(procs, repo, args.batch_delay_us)
        print(
            f"ONNX Runtime on `null`: {body['ort_null']['batch1_us']:.1f} µs per batch-1 run",
            flush=True,
        )
        if args.scaling:
            body["scaling"] = run_scaling(args, procs, stack, repo)
        else:
            body.update(run_default(args, procs, stack, repo))
    return body


def main(argv: list[str] | None = None) -> int:
    """Run, write the JSON, print the tables."""
    args = parse_args(argv)
    exit_on_signals()
    started_at = datetime.now(UTC)
    started = time.monotonic()
    cores = len(os.sched_getaffinity(0))
    if args.scaling and cores < SCALING_CORES:
        print(
            f"note: {cores} usable cores here; the scaling run is meant for a host with "
            f"{SCALING_CORES} or more. Running with what there is.",
            flush=True,
        )
    try:
        body = run(args)
    except KeyboardInterrupt:
        print("\ninterrupted; everything started was stopped", file=sys.stderr)
        return 130
    path = write_results(REPO, args.results_dir, "frontends", started_at, body)
    results = json.loads(path.read_text())
    print()
    print(render(results))
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
