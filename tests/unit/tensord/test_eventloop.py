"""The event loop choice: uvloop by default where installed, the standard loop on request."""

from __future__ import annotations

import asyncio

import pytest

from tensord.config import load_config
from tensord.eventloop import loop_factory, running_loop_name, uvloop_available


def test_auto_takes_uvloop_where_installed() -> None:
    import uvloop  # a dependency on Linux

    assert uvloop_available()
    factory = loop_factory("auto")
    assert factory is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(_name()) == f"uvloop {uvloop.__version__}"


def test_asyncio_forces_the_standard_loop() -> None:
    assert loop_factory("asyncio") is None
    with asyncio.Runner(loop_factory=loop_factory("asyncio")) as runner:
        assert runner.run(_name()) == "asyncio"


def test_uvloop_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    with pytest.raises(RuntimeError, match="uvloop is not installed"):
        loop_factory("uvloop")


def test_the_setting_is_validated() -> None:
    config = load_config(None, env={"TENSORD_SERVER_EVENT_LOOP": "asyncio"})
    assert config.server.event_loop == "asyncio"
    with pytest.raises(Exception, match="event_loop"):
        load_config(None, env={}, overrides={"server.event_loop": "trio"})


async def _name() -> str:
    return running_loop_name()
