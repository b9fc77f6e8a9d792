"""Shared pieces of the engine checker scripts (standard library only).

A checker reads one JSON object on stdin::

    {"engine": "lmcache", "pool": "kv", "format": "yaml",
     "files": {"lmcache.yaml": "..."},            # what kvagent rendered, by file name
     "directories": ["/mnt/kv/n1-ns1/lmcache"],  # the engine's directories (in the pool)
     "directory_caps": [123456789],              # each directory's hard cap, bytes
     "subdirectories": [],                       # directories kvagent made for the engine
     "tensor_parallel": 1, "data_parallel": 1}

and prints one JSON object: ``verdict`` ("accepted", "refused" or "unavailable": the
engine's code could not be loaded), ``engine_version``, ``method`` (how the engine's
code was run: imported, loaded from its files, or its source read with ``ast``),
``problems`` (why refused, in words) and ``messages`` (what the engine itself said:
warnings, log lines, its exception). Exit 0 accepted, 1 refused, 3 unavailable.

A batch, ``{"batch": [payload, ...]}``, is judged in one process (the engine imported
once): one verdict line per payload, each with its ``batch_index``, then exit 0.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shlex
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

EXIT = {"accepted": 0, "refused": 1, "unavailable": 3}


@dataclass
class Payload:
    """The render under judgement (see the module docstring)."""

    engine: str
    pool: str
    format: str
    files: dict[str, str]
    directories: list[str]
    directory_caps: list[int]
    subdirectories: list[str] = field(default_factory=list)
    tensor_parallel: int = 1
    data_parallel: int = 1

    @property
    def ranks(self) -> int:
        return self.tensor_parallel * self.data_parallel

    def cap_of(self, path: str) -> int | None:
        """The cap of the engine directory that holds ``path`` (None: outside the pool)."""
        d = owning_directory(path, self.directories)
        return None if d is None else self.directory_caps[self.directories.index(d)]


#: The payload a checker's ``main`` judges next, and its index in a batch (set by
#: :func:`run`; index None: not a batch).
_current: dict[str, Any] = {"payload": None, "index": None}


def run(main: Callable[[], None]) -> None:
    """A checker's entry point: ``main`` on the payload on stdin, or once per payload of
    a batch (each verdict line carries its ``batch_index``; exit 0 after the last)."""
    data = json.load(sys.stdin)
    if not (isinstance(data, dict) and isinstance(data.get("batch"), list)):
        _current["payload"] = data
        main()
        return
    for index, item in enumerate(data["batch"]):
        _current.update(payload=item, index=index)
        with contextlib.suppress(SystemExit):  # emit's exit: the verdict is printed
            main()
    sys.exit(0)


def read_payload() -> Payload:
    """The payload being judged (from stdin, or the batch entry :func:`run` is on)."""
    data = _current["payload"] if _current["payload"] is not None else json.load(sys.stdin)
    known = Payload.__dataclass_fields__
    return Payload(**{k: v for k, v in data.items() if k in known})


@dataclass
class Verdict:
    """What a checker found; ``emit`` prints it and exits."""

    engine_version: str | None = None
    method: str = ""
    problems: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    unavailable: bool = False

    def refuse(self, problem: str) -> None:
        self.problems.append(problem)

    @property
    def verdict(self) -> str:
        if self.unavailable:
            return "unavailable"
        return "refused" if self.problems else "accepted"


def emit(v: Verdict) -> None:
    """Print the verdict as JSON and exit with its code."""
    out: dict[str, Any] = {"verdict": v.verdict, "engine_version": v.engine_version,
                           "method": v.method, "problems": v.problems, "messages": v.messages}
    if _current["index"] is not None:
        out["batch_index"] = _current["index"]
    print(json.dumps(out, sort_keys=True), flush=True)
    sys.exit(EXIT[v.verdict])


def owning_directory(path: str, directories: list[str]) -> str | None:
    """The engine directory ``path`` lies in (itself or below), after normalising; None if
    none (a path outside the pool, or one that climbs out with ``..``)."""
    if not os.path.isabs(path):
        return None
    norm = os.path.normpath(path)
    for d in directories:
        if norm == d or norm.startswith(d.rstrip("/") + "/"):
            return d
    return None


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines (comments and blank lines skipped; shell-style quotes removed), as
    systemd's EnvironmentFile= and ``set -a; . FILE`` read kvagent's env files."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"not KEY=VALUE: {raw!r}")
        words = shlex.split(value) if value else [""]
        env[key] = words[0] if len(words) == 1 else value
    return env


def parse_args(text: str) -> list[str]:
    """Command-line arguments rendered on one line, split as a shell would."""
    return shlex.split(text)


class _Collect(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def engine_speaks(sink: list[str]) -> Iterator[None]:
    """Collect what the engine says while the block runs: warnings, log records at
    WARNING and above (from any logger, propagating or not), and stdout/stderr text."""
    handler = _Collect(sink)
    root = logging.getLogger()
    loggers = [root] + [lg for lg in logging.root.manager.loggerDict.values()
                        if isinstance(lg, logging.Logger)]
    for lg in loggers:
        lg.addHandler(handler)
    out, err = io.StringIO(), io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            yield
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    sink.extend(f"warning: {w.category.__name__}: {w.message}" for w in caught)
    sink.extend(f"stdout: {line}" for line in out.getvalue().splitlines() if line.strip())
    sink.extend(f"stderr: {line}" for line in err.getvalue().splitlines() if line.strip())


def add_handler_to_new_loggers(sink: list[str]) -> logging.Handler:
    """A WARNING handler for loggers the engine creates later (attach it yourself)."""
    return _Collect(sink)


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (None: not installed as a dist, e.g.
    files on PYTHONPATH: then the checker reads the version from the package)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def fail_unavailable(v: Verdict, what: str, exc: BaseException) -> None:
    """The engine's code cannot be loaded here: say so and exit 3."""
    v.unavailable = True
    v.messages.append(f"{what}: {type(exc).__name__}: {exc}")
    emit(v)


def json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
