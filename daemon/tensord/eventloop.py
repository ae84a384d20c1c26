"""Which asyncio event loop the daemon runs on.

uvloop (libuv, in Cython) runs the loop's own machinery (callbacks, futures, timers,
epoll) several times faster than the standard library's pure-Python loop, and every gRPC
call passes through that machinery a dozen times. grpc.aio runs on either. `auto` takes
uvloop where it is installed (it is a dependency on Linux and macOS) and the standard loop
elsewhere; `asyncio` forces the standard loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

EventLoopChoice = Literal["auto", "asyncio", "uvloop"]
T = TypeVar("T")


def uvloop_available() -> bool:
    """True when the uvloop package can be imported."""
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for asyncio.Runner(loop_factory=...); None means the standard loop.

    `uvloop` when it is not installed raises RuntimeError with what to do."""
    if choice == "asyncio" or (choice == "auto" and not uvloop_available()):
        return None
    try:
        import uvloop
    except ImportError:
        raise RuntimeError(
            'event_loop = "uvloop" but uvloop is not installed: `pip install uvloop`, or set '
            'event_loop = "auto" or "asyncio"'
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice = "auto") -> T:
    """asyncio.run(main) on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """'uvloop 0.23.0' or 'asyncio', for the running loop (logs and Info)."""
    loop = asyncio.get_running_loop()
    if type(loop).__module__.startswith("uvloop"):
        import uvloop

        return f"uvloop {uvloop.__version__}"
    return "asyncio"
