"""Starting the servers under test as subprocesses, ready to take calls.

  echo     benchmarks/echo_server.py: grpcio alone (the transport limit)
  floor    benchmarks/floor_server.py: a bare grpc.aio server running the model on a pool
  tensord  `tensord serve` on the model repository, exactly as an operator runs it

All listen on 127.0.0.1 only. A server counts as started once its port accepts
connections; the load generator then waits for the first successful Predict (the
daemon answers UNAVAILABLE while it loads and warms its models).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from procs import ProcessGroup, free_port, python_script, read_line, wait_for_port

HOST = "127.0.0.1"
_START_TIMEOUT_S = 60.0


@dataclass(slots=True)
class Server:
    """A running server: its name, pid and HOST:PORT target."""

    name: str
    proc: subprocess.Popen[str]
    target: str

    @property
    def pid(self) -> int:
        """The server's process id (for CPU accounting and profiling)."""
        return self.proc.pid


def _start_script(procs: ProcessGroup, name: str, script: str, *args: str) -> Server:
    """Start a benchmark server script; it reports the port it bound."""
    proc = procs.start(python_script(script, "--listen", f"{HOST}:0", *args))
    line = read_line(proc, _START_TIMEOUT_S).split()
    if len(line) != 2 or line[0] != "LISTENING":
        raise RuntimeError(f"{name} server said {' '.join(line)!r}, expected 'LISTENING <port>'")
    return Server(name, proc, f"{HOST}:{int(line[1])}")


def start_echo(procs: ProcessGroup) -> Server:
    """Start the echo server."""
    return _start_script(procs, "echo", "echo_server.py")


def start_floor(procs: ProcessGroup, repository: Path) -> Server:
    """Start the floor server (a bare grpc.aio server running the model on a pool)."""
    return _start_script(procs, "floor", "floor_server.py", "--model-repository", str(repository))


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
    procs: ProcessGroup, repository: Path, log: IO[str], log_level: str = "warning"
) -> Server:
    """Start the daemon on a free port, its logs to `log`; returns once it listens."""
    port = free_port(HOST)
    argv = tensord_command(repository, f"{HOST}:{port}", log_level)
    proc = procs.start(argv, stdout=log, stderr=subprocess.STDOUT)
    wait_for_port(HOST, port, proc, _START_TIMEOUT_S)
    return Server("tensord", proc, f"{HOST}:{port}")
