"""What a failed command reports: its message and hint on stderr and, with ``-o json``,
one JSON object on stdout, so that a script reads a failure the way it reads a result.

The object (docs/operations.md, "Scripts: -o json and exit codes")::

    {"error": "...", "kind": "config", "file": "/etc/kvagent/kvagent.yaml", "line": 7,
     "field": "initiator.pools[0].mount", "hint": null, "exit_code": 2,
     "problems": [{"file": ..., "line": ..., "field": ..., "message": ...}]}

``kind`` is ``usage`` (bad arguments), ``config`` (a config kvagent refuses), ``failed``
(an operation failed) or ``internal`` (a kvagent bug); ``exit_code`` is the process's
(2 for usage and config, 1 otherwise). ``file``, ``line`` and ``field`` are null where
not known; ``problems`` lists every config problem (the first one is also in ``error``,
``file``, ``line`` and ``field``). A command may add its own fields (``engines check``:
the engine's verdict).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from ..errors import EXIT_FAILED, EXIT_USAGE, KvagentError

if TYPE_CHECKING:
    from ..config import ConfigError

#: The spellings of the output option (``--output-format`` is nvme-cli's).
OUTPUT_OPTIONS = ("-o", "--output", "--output-format")
#: Its values.
OUTPUT_FORMATS = ("text", "json")


class CommandFailed(KvagentError):
    """A command that failed after it had something to report (``engines check``'s
    verdict): ``details`` go into the JSON error object; in text they were printed."""

    def __init__(self, message: str, hint: str | None = None, *,
                 details: dict[str, Any] | None = None):
        super().__init__(message, hint)
        self.details = details or {}


@dataclasses.dataclass(frozen=True)
class Failure:
    """A failed command, as the error object on stdout says it."""

    error: str
    kind: str  # usage | config | failed | internal
    exit_code: int
    hint: str | None = None
    file: str | None = None
    line: int | None = None
    field: str | None = None
    problems: tuple[dict[str, Any], ...] = ()
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The error object (a command's own details first, never over these keys)."""
        out: dict[str, Any] = dict(self.details)
        out.update(error=self.error, kind=self.kind, file=self.file, line=self.line,
                   field=self.field, hint=self.hint, exit_code=self.exit_code)
        if self.problems:
            out["problems"] = list(self.problems)
        return out


def config_failure(exc: ConfigError) -> Failure:
    """A config kvagent refuses (exit 2): every problem, the first one in front."""
    problems = tuple({"file": p.file, "line": p.line, "field": p.field, "message": p.message}
                     for p in exc.problems)
    first = problems[0] if problems else {"file": None, "line": None, "field": None,
                                          "message": str(exc)}
    return Failure(first["message"], "config", EXIT_USAGE, None, first["file"],
                   first["line"], first["field"], problems)


def error_failure(exc: KvagentError) -> Failure:
    """An operation that failed, or bad input kvagent refused (its own exit code)."""
    kind = getattr(exc, "kind", None) or ("usage" if exc.exit_code == EXIT_USAGE
                                          else "failed")
    problems = tuple({"file": None, "line": None, "field": None, "message": m}
                     for m in getattr(exc, "problems", ()))
    field_name = getattr(exc, "field", None)
    if field_name is None and exc.exit_code == EXIT_USAGE:
        # kvagent's usage errors name the argument first: "--rebind x: ...", "FILE: ..."
        named = _NAMED.match(exc.message)
        field_name = named.group(1) if named else None
    return Failure(exc.message, kind, exc.exit_code, exc.hint,
                   getattr(exc, "file", None), getattr(exc, "line", None), field_name,
                   problems, dict(getattr(exc, "details", {})))


#: An option or an argument named at the start of a message, with its value or not.
_NAMED = re.compile(r"(--[a-z][a-z0-9-]*|[A-Z][A-Z_]*)(?: \S+)?: ")


def internal_failure(exc: BaseException) -> Failure:
    """An exception kvagent did not expect: a bug (exit 1)."""
    return Failure(f"internal error: {type(exc).__name__}: {exc}", "internal", EXIT_FAILED,
                   "run again with -v to see where it happened")


def click_failure(exc: click.ClickException) -> Failure:
    """click's own refusal of the command line (an unknown option, a bad value, ...)."""
    field_name = None
    param = getattr(exc, "param", None)
    if isinstance(param, click.Option):
        field_name = param.opts[0]
    elif isinstance(param, click.Parameter) and param.name:  # an argument: FILE
        field_name = param.name.upper()
    elif getattr(exc, "option_name", None):  # no such option
        field_name = exc.option_name  # type: ignore[attr-defined]
    hint = None
    ctx = getattr(exc, "ctx", None)
    if isinstance(ctx, click.Context):
        hint = f"see '{ctx.command_path} --help'"
    message = exc.format_message()
    if type(exc).__name__ == "NoArgsIsHelpError":  # click >= 8.2: the message is the help
        message = "missing command"
    kind = "usage" if exc.exit_code == EXIT_USAGE else "failed"
    return Failure(message, kind, exc.exit_code, hint, field=field_name)


def print_json(failure: Failure) -> None:
    """The error object on stdout."""
    sys.stdout.write(json.dumps(failure.to_json(), indent=2) + "\n")
    sys.stdout.flush()


def asks_for_json(args: Sequence[str]) -> bool:
    """Whether a command line asks for ``-o json`` (the last output option given counts),
    read from the words themselves: for errors click finds before it has parsed them."""
    wanted = "text"
    words = list(args)
    for i, word in enumerate(words):
        if word == "--":
            break
        name, eq, value = word.partition("=")
        if name in OUTPUT_OPTIONS[1:] and eq:
            wanted = value
        elif word in OUTPUT_OPTIONS:
            wanted = words[i + 1] if i + 1 < len(words) else wanted
        elif word.startswith("-o") and not word.startswith("--"):
            wanted = word[2:]
    return wanted == "json"
