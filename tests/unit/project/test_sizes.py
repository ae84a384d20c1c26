"""The size limits `make lint` holds (tools/check_sizes.py): run on tiny trees, and on
this one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.tools import ROOT


def check_sizes(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "tools/check_sizes.py", "--root", str(root)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def module(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def method_of(lines: int) -> str:
    """A class whose method `run` is `lines` lines long, its `def` line included."""
    body = "".join(f"        x += {i}\n" for i in range(lines - 2))
    return f"class Worker:\n    @staticmethod\n    def run(x):\n{body}        return x\n"


def allow(root: Path, **entries: str) -> None:
    lines = "".join(f'"{key}" = "{reason}"\n' for key, reason in entries.items())
    module(root, "tools/size_allowlist.toml", "[allow]\n" + lines)


def test_a_method_over_60_lines_fails_until_the_allowlist_names_it(tmp_path: Path) -> None:
    module(tmp_path, "daemon/tensord/fine.py", method_of(60))
    module(tmp_path, "daemon/tensord/worker.py", method_of(61))
    failed = check_sizes(tmp_path)
    assert failed.returncode == 1
    assert "daemon/tensord/worker.py:3: function Worker.run has 61 lines" in failed.stderr
    assert "fine.py" not in failed.stderr
    allow(tmp_path, **{"daemon/tensord/worker.py:Worker.run": "split pending"})
    passed = check_sizes(tmp_path)
    assert passed.returncode == 0, passed.stderr


def test_a_module_over_400_lines_fails_unless_allowed(tmp_path: Path) -> None:
    module(tmp_path, "clients/python/tensord_client/long.py", "x = 1\n" * 401)
    module(tmp_path, "clients/python/tensord_client/v1/big_pb2.py", "x = 1\n" * 900)
    module(tmp_path, "daemon/tensord/edge.py", "x = 1\n" * 400)
    failed = check_sizes(tmp_path)
    assert failed.returncode == 1
    assert "tensord_client/long.py:1: the module has 401 lines" in failed.stderr
    assert "_pb2" not in failed.stderr and "edge.py" not in failed.stderr
    allow(tmp_path, **{"clients/python/tensord_client/long.py": "one table"})
    assert check_sizes(tmp_path).returncode == 0


def test_an_entry_naming_nothing_too_long_fails(tmp_path: Path) -> None:
    """Stale entries, and entries without a reason, fail: the list only shrinks."""
    module(tmp_path, "daemon/tensord/fine.py", method_of(20))
    allow(tmp_path, **{"daemon/tensord/fine.py:Worker.run": "was long"})
    stale = check_sizes(tmp_path)
    assert stale.returncode == 1 and "take it off the list" in stale.stderr
    module(tmp_path, "daemon/tensord/worker.py", method_of(70))
    allow(tmp_path, **{"daemon/tensord/worker.py:Worker.run": " "})
    unexplained = check_sizes(tmp_path)
    assert unexplained.returncode == 1 and "give a one-line reason" in unexplained.stderr


def test_nested_functions_are_named_by_their_outer_one(tmp_path: Path) -> None:
    inner = "".join(f"        y = {i}\n" for i in range(62))
    module(tmp_path, "daemon/tensord/nest.py", f"def outer():\n    def inner():\n{inner}")
    failed = check_sizes(tmp_path)
    assert "function outer.inner has 63 lines" in failed.stderr
    assert "function outer has 64 lines" in failed.stderr


def test_this_tree_keeps_its_limits() -> None:
    """What `make lint` runs: every module and function within its limit or allowed, and
    every allow-list entry still needed."""
    done = check_sizes(ROOT)
    assert done.returncode == 0, done.stderr
