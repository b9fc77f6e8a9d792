"""Structured logging: console on a TTY, JSON lines otherwise; always on stderr.

Under systemd, stderr is a stream into the journal: each line then starts with its
syslog priority, ``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug, which
journald takes off the line and keeps as the entry's PRIORITY (its stream protocol,
``SyslogLevelPrefix=yes`` by default), so ``journalctl -p err`` finds the errors. The
journal is recognised as systemd documents it: ``$JOURNAL_STREAM`` holds the device and
inode of the stream it connected, and stderr is that very file. A terminal, a file or a
pipe gets no prefix.

structlog is imported and configured at the first log call, not before: importing it
(with what it pulls in) costs several times a bare interpreter's start, and most
commands (``kvagent --version``, ``status`` answered by the daemon) never log.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import IO, Any

#: syslog priorities (sd-daemon(3)'s SD_ERR ... SD_DEBUG) of structlog's levels.
PRIORITIES = {"critical": 2, "error": 3, "exception": 3, "warning": 4, "warn": 4,
              "notice": 5, "info": 6, "debug": 7}


def is_journal_stream(stream: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` is the journal stream systemd connected (``$JOURNAL_STREAM`` is
    ``DEVICE:INODE`` of it, in decimal; a stream redirected since then is another file)."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, sep, inode = value.partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(stream.fileno())
        return (st.st_dev, st.st_ino) == (int(device), int(inode))
    except (AttributeError, OSError, ValueError):  # no file behind it (a StringIO, ...)
        return False


def with_priority(render: Callable[[Any, str, Any], str]) -> Callable[[Any, str, Any], str]:
    """``render``, each line prefixed with its level's syslog priority (``<3>...``)."""
    def prefixed(logger: Any, method: str, event: Any) -> str:
        level = event.get("level", method) if isinstance(event, dict) else method
        return f"<{PRIORITIES.get(level, 6)}>{render(logger, method, event)}"
    return prefixed

#: What :func:`configure_logging` asked for, applied at the next log call; None once done
#: (and before it is called: structlog's defaults).
_pending: list[tuple[int, IO[str] | None, bool] | None] = [None]


def configure_logging(verbosity: int = 0, stream: IO[str] | None = None,
                      json_lines: bool | None = None) -> None:
    """Set up logging. ``verbosity`` 0 = warnings+info, 1+ = debug.

    Results go to stdout elsewhere; logs never do. Takes effect at once where structlog
    is imported already, else at the first log call.
    """
    out = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not (hasattr(out, "isatty") and out.isatty())
    _pending[0] = (verbosity, stream, json_lines)
    if "structlog" in sys.modules:
        _structlog()


def _structlog() -> Any:
    """structlog, configured as :func:`configure_logging` last asked."""
    import logging

    import structlog

    if _pending[0] is None:
        return structlog
    verbosity, stream, json_lines = _pending[0]
    renderer: Any = (structlog.processors.JSONRenderer() if json_lines
                     else structlog.dev.ConsoleRenderer(colors=False))
    if is_journal_stream(stream if stream is not None else sys.stderr):
        renderer = with_priority(renderer)
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
        # Without an explicit stream, look sys.stderr up at each call: it may be replaced
        # (and the old one closed) after configuration, e.g. by click's CliRunner.
        logger_factory=(structlog.PrintLoggerFactory(file=stream) if stream is not None
                        else lambda *_: structlog.PrintLogger(file=sys.stderr)),
        cache_logger_on_first_use=False,
    )
    # Done only once configured: a structlog that cannot be configured (one too old for
    # these processors) fails every log call alike, instead of logging from the second
    # call on with structlog's defaults, on stdout, among the results.
    _pending[0] = None
    return structlog


class _LazyLogger:
    """Assembles a structlog logger at each call, with the configuration current then.

    structlog's ``get_logger().bind()`` freezes the configuration of that moment;
    loggers made at import time would keep structlog's default (stdout, every level)
    and ignore :func:`configure_logging`.
    """

    def __init__(self, values: dict[str, Any]):
        self._values = values

    def bind(self, **values: Any) -> _LazyLogger:
        return _LazyLogger({**self._values, **values})

    def __getattr__(self, attr: str) -> Any:
        return getattr(_structlog().get_logger().bind(**self._values), attr)


def get_logger(name: str | None = None, **context: Any) -> Any:
    """A bound structlog logger (``name`` becomes the ``logger`` field)."""
    return _LazyLogger({"logger": name, **context} if name else dict(context))
