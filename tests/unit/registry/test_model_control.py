"""The registry's model control on request: loads and unloads that a caller stops waiting
for still finish, an unloaded model stays unloaded across reloads, a load waits for the
model's drain."""

from __future__ import annotations

import asyncio
from pathlib import Path

import onnx
import pytest

from tensord.demo.repository import build_mlp
from tensord.registry.registry import ModelRegistry
from tensord.registry.version import ModelState


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        (tmp_path / name / "1").mkdir(parents=True)
        onnx.save(build_mlp(), tmp_path / name / "1" / "model.onnx")
    return tmp_path


def explicit(repo: Path, *load: str) -> ModelRegistry:
    registry = ModelRegistry(repo)
    registry.set_model_control("explicit", load)
    return registry


async def test_a_cancelled_unload_still_drains_and_frees(repo: Path) -> None:
    registry = explicit(repo, "a")
    await registry.load_all()
    entry = registry.version("a", 1)
    assert entry is not None and entry.state is ModelState.READY
    call = entry.inflight.__enter__()  # a call in flight holds the version
    unload = asyncio.create_task(registry.unload_model("a"))
    await asyncio.sleep(0.05)
    assert entry.state is ModelState.UNLOADING
    unload.cancel()  # the caller's deadline passes
    call.__exit__(None, None, None)  # the call ends
    for _ in range(100):
        if "a" not in registry.names():
            break
        await asyncio.sleep(0.02)
    assert "a" not in registry.names()
    assert entry.executor is None  # freed
    await registry.close()


async def test_a_cancelled_load_still_loads(repo: Path) -> None:
    registry = explicit(repo)
    await registry.load_all()
    load = asyncio.create_task(registry.load_model("b"))
    await asyncio.sleep(0)
    load.cancel()
    for _ in range(200):
        entry = registry.version("b", 1)
        if entry is not None and entry.state is ModelState.READY:
            break
        await asyncio.sleep(0.02)
    assert entry is not None and entry.state is ModelState.READY
    await registry.close()


async def test_an_unloaded_model_stays_unloaded_under_a_star(repo: Path) -> None:
    registry = explicit(repo, "*")
    await registry.load_all()
    assert registry.names() == ["a", "b"]
    assert await registry.unload_model("a")
    await registry.reload()
    assert registry.names() == ["b"]
    await registry.load_model("a")
    await registry.reload()
    assert registry.names() == ["a", "b"]
    await registry.close()


async def test_a_load_during_a_drain_loads_again(repo: Path) -> None:
    registry = explicit(repo, "a")
    await registry.load_all()
    old = registry.version("a", 1)
    assert old is not None
    call = old.inflight.__enter__()
    unload = asyncio.create_task(registry.unload_model("a"))
    await asyncio.sleep(0.05)
    load = asyncio.create_task(registry.load_model("a"))
    await asyncio.sleep(0.05)
    call.__exit__(None, None, None)
    await unload
    await load
    new = registry.version("a", 1)
    assert new is not None and new is not old and new.state is ModelState.READY
    await registry.close()
