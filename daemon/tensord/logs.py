"""Structured logs: JSON lines in production, key=value on a terminal; one event per line."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto", level: str = "info"
) -> None:
    """Configure structlog (and the standard library's logging, for grpc's messages)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if use_json:
        processors.append(structlog.processors.format_exc_info)
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(_LEVELS[level], logging.WARNING), stream=sys.stderr)
