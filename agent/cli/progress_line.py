"""A direct ``kvagent apply`` on a terminal: one line, rewritten in place, with the step in
flight (``[7, 12s] llama70b: mkfs.xfs -q -m uuid=... /dev/nvme1n1``), cleared at the end.

A cold pass can take minutes (mkfs, discovery timeouts); without it the terminal showed
nothing until the result. The steps are the ones every pass declares for the watchdog
(:mod:`agent.progress`): the line listens to them. The count is of steps begun (the
pass cannot know its total before it has run). Only on a terminal, only for text
output: a pipe, a file or ``-o json`` gets nothing. While the line shows, whatever else
writes to stderr (a log line, a message) is written above it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from .. import progress

#: Erase the terminal's current line and put the cursor at its start.
CLEAR = "\r\x1b[K"


def wanted(stream: IO[str], output: str) -> bool:
    """Whether a progress line belongs on ``stream``: a terminal that can erase a line,
    and text output."""
    return (output == "text" and hasattr(stream, "isatty") and stream.isatty()
            and os.environ.get("TERM") != "dumb")


class ProgressLine:
    """The line: the step in flight of a pass, on a terminal."""

    def __init__(self, term: IO[str], clock: Callable[[], float] = time.monotonic):
        self.term = term
        self.clock = clock
        self.started = clock()
        self.count = 0
        self.text = ""
        self.shown = False

    def on_step(self, event: str, step: progress.Step) -> None:
        """The :mod:`agent.progress` listener: a step began (or ended: the step around it,
        if any, is in flight again)."""
        if event == "start":
            self.count += 1
        else:
            around = progress.tracker.current()
            if around is None:
                return  # between steps: the last one stays until the next
            step = around
        where = f"{step.subject}: " if step.subject else ""
        self.text = (f"[{self.count}, {self.clock() - self.started:.0f}s] "
                     f"{where}{step.label or step.what}")
        self.draw()

    def draw(self) -> None:
        """Write the line over what the terminal's last line shows."""
        if not self.text:
            return
        width = _columns(self.term)
        self.term.write(CLEAR + self.text[:width - 1])
        self.term.flush()
        self.shown = True

    def clear(self) -> None:
        """Erase the line (before other text, and at the end)."""
        if self.shown:
            self.term.write(CLEAR)
            self.term.flush()
            self.shown = False


class _AboveTheLine:
    """stderr while the line shows: what others write goes above the line, which is
    drawn again after each complete line of theirs."""

    def __init__(self, line: ProgressLine, real: IO[str]):
        self._line = line
        self._real = real

    def write(self, text: str) -> int:
        if not text:  # nothing to show (click asks with b"" whether it writes bytes)
            return self._real.write(text)
        self._line.clear()
        written = self._real.write(text)
        if text.endswith("\n"):
            self._line.draw()
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def progress_line(output: str) -> Iterator[ProgressLine | None]:
    """Show the steps of the pass run inside on stderr's terminal (None: not wanted)."""
    real = sys.stderr
    if not wanted(real, output):
        yield None
        return
    line = ProgressLine(real)
    sys.stderr = _AboveTheLine(line, real)  # type: ignore[assignment]
    progress.set_listener(line.on_step)
    try:
        yield line
    finally:
        progress.set_listener(None)
        sys.stderr = real
        line.clear()


def _columns(term: IO[str]) -> int:
    try:
        return os.get_terminal_size(term.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80
