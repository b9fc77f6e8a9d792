"""Structured logging: console on a TTY, JSON lines otherwise; always on stderr."""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

import structlog


def configure_logging(verbosity: int = 0, stream: IO[str] | None = None,
                      json_lines: bool | None = None) -> None:
    """Set up structlog. ``verbosity`` 0 = warnings+info, 1+ = debug.

    Results go to stdout elsewhere; logs never do.
    """
    out = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not (hasattr(out, "isatty") and out.isatty())
    renderer: Any = (structlog.processors.JSONRenderer() if json_lines
                     else structlog.dev.ConsoleRenderer(colors=False))
    level = logging.DEBUG if verbosity > 0 else logging.INFO
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None, **context: Any) -> Any:
    """A bound structlog logger (``name`` becomes the ``logger`` field)."""
    log = structlog.get_logger()
    if name:
        log = log.bind(logger=name)
    return log.bind(**context) if context else log
