"""Structured logs: JSON lines in production, key=value on a terminal; one event per line
(on a terminal, long values go on indented lines below it, so nothing runs off the screen)."""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


CONSOLE_WIDTH = 100
"""Console lines wrap at this many characters; short fields share the event's line."""
_SHORT_FIELD = 40


def render_console(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
    """`time [level] event key=value ...`: short fields fill lines of CONSOLE_WIDTH (the
    event's, then indented ones), each long field gets indented lines of its own, and an
    exception's traceback follows."""
    event = dict(event)
    stamp = str(event.pop("timestamp", ""))[:19].replace("T", " ")
    level = f"[{event.pop('level', 'info'):<7}]"
    lines = [" ".join(p for p in (stamp, level, str(event.pop("event", "")).rstrip()) if p)]
    trace = event.pop("exception", None)
    event.pop("exc_info", None)
    long = []
    for key, value in event.items():
        text = f"{key}={value!r}" if isinstance(value, str) and " " in value else f"{key}={value}"
        if len(text) > _SHORT_FIELD:
            long.append(f"{key}: {value}")
        elif len(lines[-1]) + 1 + len(text) <= CONSOLE_WIDTH:
            lines[-1] = f"{lines[-1]} {text}"
        else:
            lines.append(f"    {text}")
    for text in long:
        lines.extend(
            textwrap.wrap(
                text,
                CONSOLE_WIDTH,
                initial_indent="    ",
                subsequent_indent="        ",
                break_on_hyphens=False,
            )
        )
    if trace:
        lines.append(str(trace).rstrip())
    return "\n".join(lines)


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto", level: str = "info"
) -> None:
    """Configure structlog, and route the standard library's logging (grpc's messages) and
    Python's warnings (NumPy's, say) through the same renderer: every line of the log is
    one structured event."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else render_console
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    processors: list[structlog.typing.Processor] = [
        *shared,
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # One write per line, newline included: the processes of one daemon (frontends,
        # engine) share stdout, and a line written in two parts could be split by another's.
        logger_factory=structlog.WriteLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(_LEVELS[level], logging.WARNING))
    logging.captureWarnings(True)
