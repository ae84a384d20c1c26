"""Starting the servers under test as subprocesses, ready to take calls.

  echo     benchmarks/echo_server.py: grpcio alone (the transport limit)
  floor    benchmarks/floor_server.py: a bare grpc.aio server running the model on a pool
  tensord  `tensord serve` on the model repository, exactly as an operator runs it

All listen on 127.0.0.1 only. A server counts as started once its port accepts
connections; the load generator then waits for the first successful Predict (the
daemon answers UNAVAILABLE while it loads and warms its models). A daemon started with
`[server] frontends` above 0 counts as started once its supervisor logs
`supervisor.ready` (every frontend listens); its engine and frontends are watched
beside the supervisor by the pids the supervisor logs.

Another commit's daemon (ab_bench.py, generate_bench.py --base) runs from a detached
worktree of it under build/ab/ (`checkout`), with `start_tensord(pythonpath=...)` set to
that checkout's sources (`checkout_pythonpath`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from procs import ProcessGroup, free_port, python_script, read_line, wait_for_port

HOST = "127.0.0.1"
_START_TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parent.parent


@dataclass(slots=True)
class Server:
    """A running server: its name, pid and HOST:PORT target."""

    name: str
    proc: subprocess.Popen[str]
    target: str
    parts: tuple[tuple[str, int], ...] = ()
    """Processes of the server besides `proc`, by role (`engine`, `frontend.0`, ...): the
    supervised daemon's children."""

    @property
    def pid(self) -> int:
        """The server's process id (for CPU accounting and profiling)."""
        return self.proc.pid


def _start_script(
    procs: ProcessGroup, name: str, script: str, *args: str, cpus: Collection[int] | None = None
) -> Server:
    """Start a benchmark server script; it reports the port it bound."""
    proc = procs.start(python_script(script, "--listen", f"{HOST}:0", *args), cpus=cpus)
    line = read_line(proc, _START_TIMEOUT_S).split()
    if len(line) != 2 or line[0] != "LISTENING":
        raise RuntimeError(f"{name} server said {' '.join(line)!r}, expected 'LISTENING <port>'")
    return Server(name, proc, f"{HOST}:{int(line[1])}")


def start_echo(procs: ProcessGroup, *args: str, cpus: Collection[int] | None = None) -> Server:
    """Start the echo server (`args`: its options, such as the reply's --model)."""
    return _start_script(procs, "echo", "echo_server.py", *args, cpus=cpus)


def start_floor(
    procs: ProcessGroup, repository: Path, *args: str, cpus: Collection[int] | None = None
) -> Server:
    """Start the floor server (a bare grpc.aio server running the model on a pool)."""
    return _start_script(
        procs, "floor", "floor_server.py", "--model-repository", str(repository), *args, cpus=cpus
    )


def tensord_command(repository: Path, listen: str, log_level: str) -> list[str]:
    """`tensord serve ...` with the tensord script beside this interpreter."""
    script = Path(sys.executable).parent / "tensord"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "tensord.cli"]
    return [
        *base,
        "serve",
        "--model-repository",
        str(repository),
        "--listen",
        listen,
        "--log-format",
        "json",
        "--log-level",
        log_level,
    ]


def start_tensord(
    procs: ProcessGroup,
    repository: Path,
    log: IO[str],
    log_level: str = "warning",
    *,
    frontends: int | None = None,
    name: str = "tensord",
    cpus: Collection[int] | None = None,
    pythonpath: str = "",
) -> Server:
    """Start the daemon on a free port, its logs to `log` (a file); returns once it listens.

    `frontends` sets `[server] frontends` (TENSORD_SERVER_FRONTENDS; None: the config's
    default). Above 0 the log level must let info lines through: the supervisor's
    `supervisor.started_child` lines name the engine's and the frontends' pids, and this
    waits for `supervisor.ready`. `cpus` pins the daemon and every process it starts;
    `pythonpath` runs the tensord found there instead of this checkout's."""
    port = free_port(HOST)
    argv = tensord_command(repository, f"{HOST}:{port}", log_level)
    env = None
    if frontends is not None:
        env = {**os.environ, "TENSORD_SERVER_FRONTENDS": str(frontends)}
    if pythonpath:  # another checkout's tensord (ab_bench.py)
        env = {**(env or os.environ), "PYTHONPATH": pythonpath}
        argv = [sys.executable, "-m", "tensord.cli", *argv[argv.index("serve") :]]
    proc = procs.start(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cpus=cpus)
    if not frontends:
        wait_for_port(HOST, port, proc, _START_TIMEOUT_S)
        return Server(name, proc, f"{HOST}:{port}")
    if log_level not in ("debug", "info"):
        raise ValueError("a daemon with frontends needs log_level info to name its children")
    children = wait_supervised(log, proc, _START_TIMEOUT_S)
    return Server(name, proc, f"{HOST}:{port}", tuple(children))


def checkout(rev: str) -> Path:
    """A detached worktree of `rev` under build/ab (made once, kept for later runs)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    path = REPO / "build" / "ab" / sha[:12]
    if not path.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--force", str(path), sha],
            cwd=REPO, check=True, capture_output=True,
        )  # fmt: skip
    return path


def checkout_pythonpath(path: Path) -> str:
    """PYTHONPATH that makes the checkout at `path` the tensord (and tensord_client)
    imported: start_tensord's `pythonpath` for another commit's daemon."""
    return f"{path / 'daemon'}:{path / 'clients' / 'python'}"


def foreign_tensord_note() -> str:
    """A warning when the tensord imported here (and so run by start_tensord without
    `pythonpath`) is not this checkout's, as when the venv's editable install points at
    another worktree; "" when it is."""
    import tensord

    where = Path(tensord.__file__).resolve().parent
    if where.is_relative_to(REPO / "daemon"):
        return ""
    return (
        f"note: tensord is imported from {where}, not from this checkout: the daemon "
        f"measured as this checkout's is that one (PYTHONPATH={checkout_pythonpath(REPO)} "
        "makes it this checkout's)"
    )


def log_events(log: IO[str]) -> list[dict[str, Any]]:
    """The JSON lines written to `log` so far (read by position; other lines skipped)."""
    size = os.fstat(log.fileno()).st_size
    text = os.pread(log.fileno(), size, 0).decode(errors="replace")
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def wait_supervised(
    log: IO[str], proc: subprocess.Popen[str], timeout: float
) -> list[tuple[str, int]]:
    """Wait for `supervisor.ready` in the daemon's log; its children as (role, pid), the
    latest pid of each (`engine`, `frontend.0`, `frontend.1`, ...)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tensord exited with {proc.returncode} before it was ready")
        events = log_events(log)
        if any(e.get("event") == "supervisor.ready" for e in events):
            return supervised_children(events)
        time.sleep(0.05)
    raise TimeoutError(f"tensord logged no supervisor.ready within {timeout:.0f} s")


def supervised_children(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(role, pid) of each child the supervisor started, the latest for each role."""
    children: dict[str, int] = {}
    for e in events:
        if e.get("event") == "supervisor.started_child":
            role = "engine" if e["role"] == "engine" else f"frontend.{e['index']}"
            children[role] = int(e["pid"])
    return sorted(children.items())
