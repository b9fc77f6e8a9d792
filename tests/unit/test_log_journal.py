"""Log lines carry their syslog priority into the journal (issue 35: `journalctl -p err`
showed nothing, every line reached the journal at the stream's default priority).

Under systemd, stderr is the journal's stream and ``$JOURNAL_STREAM`` names it
(``DEVICE:INODE``); journald reads a ``<N>`` at a line's start as its priority. Here the
"journal" is a file whose device and inode ``$JOURNAL_STREAM`` names, as systemd would.
"""

from __future__ import annotations

import json
import os
import pty
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from agent import log as kvlog


@pytest.fixture(autouse=True)
def _default_logging() -> Iterator[None]:
    yield
    kvlog.configure_logging()


def stream_id(stream: IO[str]) -> str:
    st = os.fstat(stream.fileno())
    return f"{st.st_dev}:{st.st_ino}"


def log_every_level(stream: IO[str]) -> None:
    kvlog.configure_logging(1, stream=stream, json_lines=True)
    logger = kvlog.get_logger("test")
    logger.error("an error", pool="p")
    logger.warning("a warning")
    logger.info("some info")
    logger.debug("a detail")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("an unexpected error")
    stream.flush()


def test_each_level_gets_its_syslog_priority_in_the_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "journal-stream"
    with path.open("w") as journal:
        monkeypatch.setenv("JOURNAL_STREAM", stream_id(journal))
        log_every_level(journal)
    lines = path.read_text().splitlines()
    assert [line[:3] for line in lines] == ["<3>", "<4>", "<6>", "<7>", "<3>"]
    events = [json.loads(line[3:]) for line in lines]  # the rest is the JSON line as before
    assert [(e["event"], e["level"]) for e in events] == [
        ("an error", "error"), ("a warning", "warning"), ("some info", "info"),
        ("a detail", "debug"), ("an unexpected error", "error")]
    assert "ValueError: boom" in events[-1]["exception"]  # one line: the traceback inside


def test_another_file_gets_no_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stderr redirected after systemd started the process (2>file): not the journal."""
    with (tmp_path / "journal").open("w") as journal, \
            (tmp_path / "log").open("w") as other:
        monkeypatch.setenv("JOURNAL_STREAM", stream_id(journal))
        log_every_level(other)
    lines = (tmp_path / "log").read_text().splitlines()
    assert len(lines) == 5 and all(line.startswith("{") for line in lines)


def test_no_journal_stream_no_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    with (tmp_path / "log").open("w") as out:
        log_every_level(out)
    assert all(line.startswith("{") for line in (tmp_path / "log").read_text().splitlines())


def test_a_terminal_gets_no_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell whose environment came from a systemd service (a terminal emulator run as a
    user unit) inherits $JOURNAL_STREAM; its stderr is the terminal, not that stream."""
    leader, follower = pty.openpty()
    try:
        with (tmp_path / "journal").open("w") as journal, \
                os.fdopen(follower, "w", closefd=False) as tty:
            monkeypatch.setenv("JOURNAL_STREAM", stream_id(journal))
            kvlog.configure_logging(0, stream=tty)
            kvlog.get_logger("test").error("on a terminal")
            tty.flush()
            out = os.read(leader, 4096).decode()
        assert "on a terminal" in out and "<3>" not in out and not out.startswith("{")
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.parametrize("value", ["", "12", "a:b", "1:2:3", "-1:x"])
def test_a_malformed_journal_stream_is_not_the_journal(tmp_path: Path, value: str) -> None:
    with (tmp_path / "log").open("w") as out:
        assert not kvlog.is_journal_stream(out, {"JOURNAL_STREAM": value})
        assert kvlog.is_journal_stream(out, {"JOURNAL_STREAM": stream_id(out)})


def test_a_stream_without_a_file_is_not_the_journal() -> None:
    import io

    assert not kvlog.is_journal_stream(io.StringIO(), {"JOURNAL_STREAM": "1:2"})
