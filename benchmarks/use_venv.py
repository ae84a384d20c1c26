"""Imported first by predict_bench.py: re-run it under the project's .venv when needed.

`python benchmarks/predict_bench.py` may start with an interpreter that lacks grpcio or
tensord; then this hands the same command over to .venv/bin/python (os.execv), so the
benchmark, its subprocesses and the daemon all use the project's environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

try:
    import grpc  # noqa: F401

    import tensord  # noqa: F401
except ImportError:
    _VENV = REPO / ".venv"
    _VENV_PYTHON = _VENV / "bin" / "python"
    # Compare prefixes, not executables: a venv's python is often a symlink to the base one.
    if _VENV_PYTHON.exists() and Path(sys.prefix).resolve() != _VENV.resolve():
        os.execv(str(_VENV_PYTHON), [str(_VENV_PYTHON), *sys.argv])
    raise
