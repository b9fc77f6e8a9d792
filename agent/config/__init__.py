"""kvagent configuration: load one YAML file into a frozen, typed :class:`Config`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..dhchap import redact
from .build import Builder, Problem, format_path
from .model import (
    Config,
    DeviceBacking,
    EngineConfig,
    FileBacking,
    HealthConfig,
    InitiatorConfig,
    InitiatorPool,
    LvmBacking,
    NodeConfig,
    PortConfig,
    TargetConfig,
    TargetHost,
    TargetPool,
    TargetRef,
)
from .yamlsource import MarkedDict, line_of, load_yaml

DEFAULT_CONFIG_PATH = "/etc/kvagent/kvagent.yaml"
CONFIG_ENV = "KVAGENT_CONFIG"

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG_PATH",
    "Config",
    "ConfigError",
    "ConfigProblem",
    "DeviceBacking",
    "EngineConfig",
    "FileBacking",
    "HealthConfig",
    "InitiatorConfig",
    "InitiatorPool",
    "LvmBacking",
    "NodeConfig",
    "PortConfig",
    "TargetConfig",
    "TargetHost",
    "TargetPool",
    "TargetRef",
    "config_path",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a config file, located as precisely as the loader knows."""

    file: str
    line: int | None
    field: str
    message: str

    def __post_init__(self) -> None:
        # A secret pasted where its file belongs would be echoed to the terminal, the
        # journal, kvagent status and apply's answer: never show it (issue 24).
        field, message = redact(self.field), redact(self.message)
        if (field, message) != (self.field, self.message):
            message += ("; that is a secret itself, and the config holds only paths: put it "
                        "in a file of its own (root's, mode 0600; kvagent keys generate "
                        "makes one) and give the file's path")
        object.__setattr__(self, "field", field)
        object.__setattr__(self, "message", message)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}"


class ConfigError(Exception):
    """The config file is missing, unreadable, not YAML, or invalid. Carries every problem."""

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The config file to use: explicit argument, else ``$KVAGENT_CONFIG``, else the default."""
    if explicit:
        return Path(explicit)
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)


def parse_config(text: str, source: str = "<config>") -> Config:
    """Parse and validate config text; raise :class:`ConfigError` listing every problem."""
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([ConfigProblem(source, line, "(yaml)", f"not valid YAML: {problem}")])\
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


#: The largest config file kvagent reads (a config of 1024 pools is well under 1 MiB).
MAX_CONFIG_BYTES = 16 << 20


def trust_problem(st: os.stat_result, euid: int) -> str | None:
    """Why a process running as ``euid`` must not take a config file with status ``st``
    (None: it may). Root takes only a file that root owns and nobody else can write (its
    group may, when that is root's group): the config decides what root formats, exports
    and deletes."""
    if euid != 0:
        return None
    if st.st_uid != 0:
        return (f"is owned by uid {st.st_uid}, not root: a root kvagent does not take orders "
                "from a file another user can change (chown root FILE)")
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0):
        return (f"is writable by its group or by everyone (mode {st.st_mode & 0o7777:04o}, "
                f"group {st.st_gid}): a root kvagent does not take orders from a file others "
                "can change (chmod go-w FILE)")
    return None


def _read_config_file(file: Path) -> str:
    """The config file's text, after checking who could have written it."""
    with open(file, "rb") as f:
        problem = trust_problem(os.fstat(f.fileno()), os.geteuid())
        if problem:
            raise ConfigError([ConfigProblem(str(file), None, "(file)", problem)])
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError([ConfigProblem(str(file), None, "(file)",
                                         f"is larger than {MAX_CONFIG_BYTES >> 20} MiB")])
    return data.decode("utf-8")


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the config file (see :func:`config_path`); raise :class:`ConfigError` if bad
    (as root: also when it is not root's, or others may write it)."""
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
