"""The client as its own distribution: its wheel installs into a fresh environment that holds
gRPC, protobuf and NumPy and nothing of the daemon, and from there the library and tensorctl
talk to a real server; the daemon's wheel depends on it and carries none of it.

No package index is needed: the fresh environment gets the client's dependencies by links to
the distributions installed here (their packages and their .dist-info, so `pip check`
sees them), and the client wheel with `pip install --no-deps --no-index`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerThread, serve
from tests.tools import ROOT, require_module

CLIENT_DIR = ROOT / "clients" / "python"
CLIENT_REQUIRES = {"grpcio", "protobuf", "numpy"}
"""What the client may depend on (its extras aside)."""


def _build_wheel(sources: list[Path], out: Path) -> Path:
    """A wheel built from a copy of `sources` (never in the tree: a stale build/lib there
    would end up in it)."""
    tree = out / "src"
    tree.mkdir()
    for source in sources:
        if source.is_dir():
            skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(source, tree / source.name, ignore=skip)
        else:
            shutil.copy2(source, tree / source.name)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(tree)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def _requirement_names(requirements: list[str]) -> set[str]:
    """The distributions a list of Requires-Dist needs here (extras left out)."""
    from packaging.requirements import Requirement

    parsed = [Requirement(r) for r in requirements]
    return {r.name for r in parsed if r.marker is None or r.marker.evaluate({"extra": ""})}


def _link_distribution(name: str, site: Path, done: set[str]) -> None:
    """Link an installed distribution (and what it needs) into another site-packages."""
    dist = importlib.metadata.distribution(name)
    if dist.name.lower() in done:
        return
    done.add(dist.name.lower())
    installed = Path(str(dist.locate_file("")))
    tops = {Path(str(f)).parts[0] for f in dist.files or ()}
    for top in sorted(tops - {"..", "__pycache__"}):
        source = installed / top
        if source.is_dir() and not (source / "__init__.py").exists() and "." not in top:
            # A namespace package (google/): link only this distribution's part of it.
            parts = {
                Path(str(f)).parts[1] for f in dist.files or () if Path(str(f)).parts[0] == top
            }
            (site / top).mkdir(exist_ok=True)
            for part in parts - {"__pycache__"}:
                (site / top / part).symlink_to(source / part)
        elif not (site / top).exists():
            (site / top).symlink_to(source)
    for needed in _requirement_names(dist.requires or []):
        _link_distribution(needed, site, done)


class FreshEnv:
    """A new virtual environment with the client wheel and its dependencies only."""

    def __init__(self, root: Path, wheel: Path) -> None:
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120
        )
        self.root = root
        self.python = root / "bin" / "python"
        (self.site,) = root.glob("lib/python*/site-packages")
        self.pip("install", "--no-deps", "--no-index", "-q", str(wheel))
        linked: set[str] = set()
        for name in self.requires():
            _link_distribution(name, self.site, linked)

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python",
             str(self.python), *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    def requires(self) -> set[str]:
        """The client's Requires-Dist, as the fresh environment's metadata reads them."""
        out = self.run_python(
            "import importlib.metadata as m, json; print(json.dumps(m.requires('tensord-client')))"
        )
        return _requirement_names(json.loads(out.stdout))

    def run(
        self, *argv: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A command of the environment, from outside the repository, with no PYTHONPATH."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TENSORD_"))}
        return subprocess.run(
            [str(self.root / "bin" / argv[0]), *argv[1:]],
            cwd=self.root,
            env={**clean, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def run_python(self, code: str) -> subprocess.CompletedProcess[str]:
        result = self.run("python", "-I", "-c", code)
        assert result.returncode == 0, result.stderr
        return result


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> FreshEnv:
    require_module("setuptools")
    require_module("packaging")
    out = tmp_path_factory.mktemp("client-wheel")
    wheel = _build_wheel([CLIENT_DIR / "pyproject.toml", CLIENT_DIR / "README.md",
                          CLIENT_DIR / "LICENSE", CLIENT_DIR / "tensord_client"], out)  # fmt: skip
    return FreshEnv(tmp_path_factory.mktemp("fresh") / "venv", wheel)


@pytest.fixture(scope="module")
def mlp_server(small_repo: Path) -> Iterator[ServerThread]:
    srv = serve(small_repo)
    yield srv
    srv.stop()


def test_the_client_needs_grpc_protobuf_and_numpy_only(fresh: FreshEnv) -> None:
    assert fresh.requires() == CLIENT_REQUIRES
    fresh.pip("check")  # every requirement is met by those three (and what they need)
    out = fresh.run_python(
        "import importlib.util as u, sys, tensord_client, tensord_client.cli\n"
        "print(tensord_client.__file__)\n"
        "print(sorted(m.split('.')[0] for m in sys.modules if m.startswith(('tensord', 'onnx'))))\n"
        "print([n for n in ('tensord', 'onnx', 'pydantic', 'tokenizers') if u.find_spec(n)])"
    )
    where, modules, present = out.stdout.splitlines()
    assert Path(where).is_relative_to(fresh.site)
    assert set(json.loads(modules.replace("'", '"'))) == {"tensord_client"}
    assert present == "[]"


def test_tensorctl_and_the_library_from_the_fresh_environment(
    fresh: FreshEnv, mlp_server: ServerThread
) -> None:
    help_text = fresh.run("tensorctl", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "TENSORD_TARGET" in help_text.stdout and "exit status" in help_text.stdout

    target = {"TENSORD_TARGET": mlp_server.target}  # no --target: the variable names it
    health = fresh.run("tensorctl", "health", env=target)
    assert health.returncode == 0, health.stderr
    assert health.stdout.splitlines()[0] == "server: SERVING"
    row = json.dumps([[0.5] * 512])
    predict = fresh.run("tensorctl", "--json", "predict", "mlp", "-i", f"input={row}", env=target)
    assert predict.returncode == 0, predict.stderr
    output = json.loads(predict.stdout)["output"]
    assert (output["dtype"], output["shape"]) == ("float32", [1, 10])

    out = fresh.run_python(
        "import json\n"
        "import numpy as np\n"
        "from tensord_client import Client, NotFound\n"
        f"with Client({mlp_server.target!r}, retries=0) as c:\n"
        "    h = c.health()\n"
        "    y = c.predict('mlp', {'input': np.full((2, 512), 0.5, np.float32)})['output']\n"
        "    try:\n"
        "        c.predict('nope', {'input': np.zeros((1, 512), np.float32)})\n"
        "    except NotFound as exc:\n"
        "        missing = exc.code().name\n"
        "    states = [m.state for m in h.models if m.name == 'mlp']\n"
        "    print(json.dumps([h.status, states, y.shape, missing, y[0].tolist()]))"
    )
    status, states, shape, missing, row_out = json.loads(out.stdout)
    assert (status, states, shape, missing) == ("SERVING", ["READY"], [2, 10], "NOT_FOUND")
    assert output["values"][0] == row_out  # the library and tensorctl agree


def test_the_daemon_wheel_depends_on_the_client_and_carries_none_of_it(
    tmp_path: Path,
) -> None:
    require_module("setuptools")
    import tensord
    import tensord_client

    wheel = _build_wheel(
        [ROOT / "pyproject.toml", ROOT / "setup.py", ROOT / "MANIFEST.in", ROOT / "README.md",
         ROOT / "LICENSE", ROOT / "daemon", ROOT / "kernels"],
        tmp_path,
    )  # fmt: skip
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [
            line.removeprefix("Requires-Dist: ")
            for line in whl.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
        entry_points = whl.read(metadata.replace("METADATA", "entry_points.txt")).decode()
    assert f"tensord-client=={tensord.__version__}" in requires
    assert tensord_client.__version__ == tensord.__version__
    assert not [n for n in names if n.startswith("tensord_client/") or "_pb2" in n]
    assert "tensord/v1/__init__.py" in names
    assert "tensorctl" not in entry_points and "tensord = tensord.cli:main" in entry_points
