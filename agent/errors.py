"""Exceptions that the CLI turns into clear messages and exit codes."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class KvagentError(Exception):
    """An operation failed in a way the operator can act on (exit 1).

    ``hint`` says what to do about it.
    """

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class UsageError(KvagentError):
    """Bad input from the operator: arguments or state that make the request invalid (exit 2)."""

    exit_code = EXIT_USAGE
