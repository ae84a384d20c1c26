"""Starting the two servers under test as subprocesses, ready to take calls.

  echo     benchmarks/echo_server.py: grpcio alone (the transport limit)
  tensord  `tensord serve` on the model repository, exactly as an operator runs it

Both listen on 127.0.0.1 only. A server counts as started once its port accepts
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


def start_echo(procs: ProcessGroup) -> Server:
    """Start the echo server; it reports the port it bound."""
    proc = procs.start(python_script("echo_server.py", "--listen", f"{HOST}:0"))
    line = read_line(proc, _START_TIMEOUT_S).split()
    if len(line) != 2 or line[0] != "LISTENING":
        raise RuntimeError(f"echo server said {' '.join(line)!r}, expected 'LISTENING <port>'")
    return Server("echo", proc, f"{HOST}:{int(line[1])}")


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
