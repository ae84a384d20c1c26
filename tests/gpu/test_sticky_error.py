"""A real illegal-address fault on the GPU is classified as a lost device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.tools import ROOT

pytestmark = pytest.mark.gpu


def test_illegal_address_is_sticky_and_typed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.gpu.illegal_address"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    lost = {"error": "cudaErrorIllegalAddress", "device_lost": True}
    assert report == {"sync": lost, "after": lost}
