"""kvagent configuration: load one YAML file into a frozen, typed :class:`Config`.

What every command needs (the file's path, :class:`ConfigError`) is defined here; the
model and the loader (:mod:`.model`, :mod:`.load`) are imported when first used, so that
a command that reads no config (``kvagent --version``, ``status`` answered by the daemon)
does not pay for them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .load import load_config, parse_config
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

#: Names imported from a submodule at first use: name -> submodule.
_LAZY = {
    **dict.fromkeys(("Config", "DeviceBacking", "EngineConfig", "FileBacking", "HealthConfig",
                     "InitiatorConfig", "InitiatorPool", "LvmBacking", "NodeConfig",
                     "PortConfig", "TargetConfig", "TargetHost", "TargetPool", "TargetRef"),
                    "model"),
    "load_config": "load",
    "parse_config": "load",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


DEFAULT_CONFIG_PATH = "/etc/kvagent/kvagent.yaml"
CONFIG_ENV = "KVAGENT_CONFIG"
#: The longest field path and message a problem shows, and the most problems an error
#: lists: a config error is printed, logged, kept in the agent's snapshot and sent to
#: kvagent apply, so it stays small whatever the file holds (a few hundred bytes of YAML
#: aliases expand to megabytes of values, or to thousands of problems).
MAX_FIELD_CHARS = 200
MAX_MESSAGE_CHARS = 1000
MAX_PROBLEMS = 50

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
        from ..dhchap import redact
        from ..text import clip

        field, message = redact(self.field), redact(self.message)
        if (field, message) != (self.field, self.message):
            message += ("; that is a secret itself, and the config holds only paths: put it "
                        "in a file of its own (root's, mode 0600; kvagent keys generate "
                        "makes one) and give the file's path")
        field, message = clip(field, MAX_FIELD_CHARS), clip(message, MAX_MESSAGE_CHARS)
        object.__setattr__(self, "field", field)
        object.__setattr__(self, "message", message)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}"


class ConfigError(Exception):
    """The config file is missing, unreadable, not YAML, or invalid. Carries its problems
    (the first :data:`MAX_PROBLEMS`, then one that counts the rest)."""

    def __init__(self, problems: list[ConfigProblem]):
        if len(problems) > MAX_PROBLEMS:
            first = problems[0]
            problems = [*problems[:MAX_PROBLEMS], ConfigProblem(
                first.file, None, "(config)",
                f"{len(problems) - MAX_PROBLEMS} more problem(s) not shown; fix these first")]
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The config file to use: explicit argument, else ``$KVAGENT_CONFIG``, else the default."""
    if explicit:
        return Path(explicit)
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)


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
    if _others_write(st):
        return (f"is writable by its group or by everyone (mode {st.st_mode & 0o7777:04o}, "
                f"group {st.st_gid}): a root kvagent does not take orders from a file others "
                "can change (chmod go-w FILE)")
    return None


def directory_trust_problem(st: os.stat_result, euid: int) -> str | None:
    """Why a process running as ``euid`` must not take a config file below a directory
    with status ``st`` (None: it may). As root, every directory from ``/`` down to the
    file's must be root's and writable by nobody else (its group may, when that is root's
    group), sticky or not: whoever may change a directory may swap the config in it for
    another file, or a link to any YAML file root can read."""
    if euid != 0:
        return None
    if st.st_uid != 0:
        return (f"is owned by uid {st.st_uid}, not root: its owner could swap the config in "
                "it for another file; a root kvagent takes its config only from "
                "directories root alone can change (move the config, e.g. to /etc/kvagent/)")
    if _others_write(st):
        return (f"is writable by its group or by everyone (mode {st.st_mode & 0o7777:04o}, "
                f"group {st.st_gid}): others could swap the config in it for another file; "
                "a root kvagent takes its config only from directories root alone can "
                "change (move the config, e.g. to /etc/kvagent/)")
    return None


def _others_write(st: os.stat_result) -> bool:
    """Whether someone other than the owner (and root's group) may write ``st``'s file."""
    return bool(st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0))
