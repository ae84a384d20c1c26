"""The documentation stays true: the configuration reference is generated from the
settings themselves, and is current."""

from __future__ import annotations

import subprocess
import sys

from tests.tools import ROOT


def test_the_configuration_reference_is_current() -> None:
    """docs/configuration.md is what `make docs` writes from the settings' docstrings and
    defaults; edit those and run `make docs`."""
    done = subprocess.run(
        [sys.executable, "tools/config_reference.py", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_every_daemon_key_is_in_the_reference() -> None:
    from tensord.config import env_keys

    text = (ROOT / "docs" / "configuration.md").read_text()
    for variable, key in env_keys().items():
        assert f"| `{key}` |" in text and f"`{variable}`" in text, key
