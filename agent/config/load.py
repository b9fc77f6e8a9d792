"""Reading and validating the config file: YAML with line marks, the typed model built
from it, every problem located by file, line and field."""

from __future__ import annotations

import errno
import gc
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import yaml

from . import (
    CONFIG_ENV,
    ConfigError,
    ConfigProblem,
    config_path,
    directory_trust_problem,
    trust_problem,
)
from .build import Builder, Problem, format_path
from .model import Config
from .yamlsource import MarkedDict, line_of, load_yaml

#: The largest config file kvagent reads (a config of 1024 pools is well under 1 MiB).
MAX_CONFIG_BYTES = 16 << 20


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The cycle collector paused: parsing and building make tens of thousands of objects
    and no cycles, and the collections they set off scan every object made so far (at 640
    pools they were a third of the YAML parse)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def parse_config(text: str, source: str = "<config>") -> Config:
    """Parse and validate config text; raise :class:`ConfigError` listing every problem."""
    with _no_cycle_collection():
        return _parse_config(text, source)


def _parse_config(text: str, source: str) -> Config:
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([ConfigProblem(source, line, "(yaml)", f"not valid YAML: {problem}")])\
            from None
    except ValueError as exc:  # a value the YAML constructors cannot make (an int too long)
        why = str(exc).split(";")[0]  # (not Python's advice on raising its limit)
        raise ConfigError([ConfigProblem(source, None, "(yaml)", f"not valid YAML: {why}")])\
            from None
    if data is None:
        raise ConfigError([ConfigProblem(source, None, "(top level)",
                                         "the file is empty; it needs at least 'version: 1'")])
    if not isinstance(data, MarkedDict):
        raise ConfigError([ConfigProblem(source, getattr(data, "line", 1), "(top level)",
                                         "must be a mapping of sections (version, node, ...)")])
    if "version" not in data:
        raise ConfigError([ConfigProblem(source, 1, "version", "is required and must be 1")])
    builder = Builder()
    config = builder.build(Config, data)
    if builder.problems or config is None:
        raise ConfigError([_locate(source, data, p) for p in builder.problems])
    return config


def _locate(source: str, data: MarkedDict, problem: Problem) -> ConfigProblem:
    return ConfigProblem(source, line_of(data, problem.path), format_path(problem.path),
                         problem.message)


def _read_config_file(file: Path) -> str:
    """The config file's text, after checking who could have written it (as root: the file
    and every directory above it, reached without following a link)."""
    euid = os.geteuid()
    fd = (_open_as_root(file) if euid == 0
          else os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            _refuse(file, "is not a regular file")
        problem = trust_problem(st, euid)
        if problem:
            _refuse(file, problem)
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        _refuse(file, f"is larger than {MAX_CONFIG_BYTES >> 20} MiB")
    return data.decode("utf-8")


def _open_as_root(file: Path) -> int:
    """An fd of ``file`` reached from ``/`` one directory fd at a time: each directory root's
    and writable by nobody else (:func:`directory_trust_problem`), no component a symbolic
    link (``O_NOFOLLOW``), the file opened without blocking (a FIFO)."""
    path = os.path.normpath(os.path.join(os.getcwd(), file))
    *dirs, name = path.split("/")[1:]
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = ""
        for part in ["", *dirs]:
            if part:
                here += "/" + part
                try:
                    next_fd = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                                      | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.ENOTDIR and os.path.islink(here):
                        _refuse(file, f"is reached through {here}, a symbolic link: a root "
                                "kvagent takes its config only by its real path "
                                f"({os.path.realpath(here)}/...)")
                    raise
                os.close(fd)
                fd = next_fd
            problem = directory_trust_problem(os.fstat(fd), 0)
            if problem:
                _refuse(file, f"the directory {here or '/'} above it {problem}")
        try:
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                           dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                _refuse(file, f"is a symbolic link (to {os.readlink(path)}): a root kvagent "
                        "opens its config without following links; give the real path")
            raise
    finally:
        os.close(fd)


def _refuse(file: Path, why: str) -> NoReturn:
    raise ConfigError([ConfigProblem(str(file), None, "(file)", why)])


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the config file (see :func:`config_path`); raise :class:`ConfigError` if bad
    (as root: also when it or a directory above it is not root's, or others may write it,
    or its path holds a symbolic link)."""
    file = config_path(path)
    try:
        text = _read_config_file(file)
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(str(file), None, "(file)",
                                         "does not exist (give one with -c/--config or "
                                         f"${CONFIG_ENV})")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem(str(file), None, "(file)",
                                         f"cannot be read: {exc}")]) from None
    return parse_config(text, str(file))
