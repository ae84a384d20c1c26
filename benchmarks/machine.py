"""What the results depend on: the host, the library versions, the code under test.

Recorded in every results file so two runs can be compared only when they should be.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("tensord", "grpcio", "onnxruntime", "protobuf", "numpy")


def cpu_model() -> str:
    """The CPU model name as the kernel reports it, or the platform's guess."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_state(repo: Path) -> dict[str, Any]:
    """HEAD and the files that differ from it (the daemon may be mid-edit)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if line]
    return {"head": git("rev-parse", "HEAD") or None, "changed_files": changed}


def machine_info(repo: Path) -> dict[str, Any]:
    """CPU, cores, OS, Python and package versions, and the git state of `repo`."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "packages": {name: _version(name) for name in _PACKAGES},
        "git": git_state(repo),
    }


def write_results(
    repo: Path, directory: Path, stem: str, started: datetime, body: dict[str, Any]
) -> Path:
    """Write `body` with the schema, start time and machine to directory/<stem>-<time>.json;
    print and return the path."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{stem}-{started:%Y%m%d-%H%M%S}.json"
    result = {
        "schema": 1,
        "started_at": started.isoformat(timespec="seconds"),
        "machine": machine_info(repo),
        **body,
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"results: {out.relative_to(repo) if out.is_relative_to(repo) else out}")
    return out
