"""Packages kernels/*.cu and *.cuh into tensord/kernels/cuda/ so an installed daemon finds
its CUDA sources (metadata lives in pyproject.toml)."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithKernels(build_py):
    """build_py, then copy the CUDA sources next to the kernels package."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "tensord" / "kernels" / "cuda"
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted((ROOT / "kernels").glob("*.cu*")):
            shutil.copy2(source, target / source.name)


setup(cmdclass={"build_py": BuildPyWithKernels})
