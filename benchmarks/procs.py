"""Subprocess lifetimes: everything the benchmark starts is stopped, on success or not.

Children run in their own sessions, so a Ctrl-C in the terminal reaches only the
benchmark, which then stops them in order (load generators, then servers): SIGTERM,
a grace period, then SIGKILL. SIGTERM and SIGHUP to the benchmark are turned into
SystemExit so that the same clean-up runs for them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO

BENCH_DIR = Path(__file__).resolve().parent


def exit_on_signals() -> None:
    """Make SIGTERM and SIGHUP raise SystemExit, so `finally` and context exits run."""

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)


def python_script(name: str, *args: str) -> list[str]:
    """argv running benchmarks/<name> with this interpreter, unbuffered."""
    return [sys.executable, "-u", str(BENCH_DIR / name), *args]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(host: str, port: int, proc: subprocess.Popen[str], timeout: float) -> None:
    """Wait until `host:port` accepts TCP connections; fail if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout:.0f} s")


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next stdout line of `proc`, or an error on timeout or end of output."""
    stream = proc.stdout
    if stream is None:
        raise ValueError("the process was started without stdout=PIPE")
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"{_short(proc)} printed nothing within {timeout:.0f} s")
    line = stream.readline()
    if not line:
        code = proc.wait(timeout=5)
        raise RuntimeError(f"{_short(proc)} exited with {code} (see its stderr above)")
    return line


def _short(proc: subprocess.Popen[str]) -> str:
    args = proc.args
    if isinstance(args, (list, tuple)):
        return " ".join(Path(str(a)).name for a in args[1:3])
    return str(args)


class ProcessGroup:
    """Starts subprocesses and stops every one of them when the `with` block ends."""

    def __init__(self, grace: float = 10.0) -> None:
        self._procs: list[subprocess.Popen[str]] = []
        self._grace = grace

    def start(
        self,
        argv: Sequence[str],
        *,
        stdin: int | IO[str] | None = subprocess.DEVNULL,
        stdout: int | IO[str] | None = subprocess.PIPE,
        stderr: int | IO[str] | None = None,
        env: dict[str, str] | None = None,
        cpus: Collection[int] | None = None,
    ) -> subprocess.Popen[str]:
        """Start `argv` in its own session; stderr goes to ours unless redirected. With
        `cpus`, the process (and every process it starts) may run only on those cores."""
        # Set in the child between fork and exec; its own children inherit it.
        pin = None if cpus is None else functools.partial(os.sched_setaffinity, 0, set(cpus))
        proc = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            text=True,
            start_new_session=True,
            env=env,
            preexec_fn=pin,
        )
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[str]) -> int:
        """SIGTERM, wait up to the grace period, then SIGKILL; returns the exit code."""
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=self._grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except ProcessLookupError:
                pass
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if proc in self._procs:
            self._procs.remove(proc)
        return proc.returncode

    def stop_all(self) -> None:
        """Stop every process still tracked, newest first (clients before servers)."""
        while self._procs:
            self.stop(self._procs[-1])

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A second Ctrl-C during clean-up must not leave servers behind.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.stop_all()
        finally:
            signal.signal(signal.SIGINT, previous)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (used by the self-check after a run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
