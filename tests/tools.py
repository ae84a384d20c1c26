"""External tools the tests drive (buf, node, systemd): found, or failed under CI, or skipped."""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def require_tool(path: Path | None, what: str, install: str) -> Path:
    """The tool's path; a missing tool fails under CI=true and skips elsewhere."""
    if path is not None and path.exists():
        return path
    message = f"{what} is not installed; run `{install}`"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def require_module(name: str, install: str = "make setup") -> ModuleType:
    """The module; missing, it fails under CI=true and skips elsewhere."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        message = f"{name} is not installed ({exc}); run `{install}`"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def buf() -> Path:
    """The buf CLI that `make npm-deps` installs (or one on PATH)."""
    local = ROOT / "protos" / "node_modules" / ".bin" / "buf"
    found = shutil.which("buf")
    candidate = local if local.exists() else (Path(found) if found else None)
    return require_tool(candidate, "buf", "make npm-deps")


def systemd_tool(name: str) -> Path:
    """systemd-analyze, systemd-sysusers or systemd-tmpfiles (Debian's `systemd` package)."""
    found = shutil.which(name)
    return require_tool(Path(found) if found else None, name, "make systemd-tools")


def system_tool(name: str, package: str) -> Path:
    """A Debian-packaged tool on PATH (or in /usr/sbin, off a non-root PATH); `make test`
    installs the package."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    return require_tool(Path(found) if found else None, name, f"apt-get install {package}")


def promtool() -> Path:
    """Prometheus's promtool, from the Debian package `prometheus`."""
    return system_tool("promtool", "prometheus")


def nginx() -> Path:
    """nginx, from the Debian package `nginx`."""
    return system_tool("nginx", "nginx")
