"""What a plan or an apply reports: ``{"changed", "actions", "errors"}``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["planned", "done", "failed", "skipped"]


@dataclass(frozen=True)
class ActionRecord:
    """One change, planned or carried out."""

    role: str  # target | initiator
    pool: str | None
    kind: str  # e.g. lvm.lvcreate, nvmet.mkdir, nvme.connect, mkfs, mount
    subject: str
    detail: str = ""
    status: Status = "planned"
    error: str | None = None


@dataclass(frozen=True)
class ErrorRecord:
    """A problem that stopped part of the work (a pool, a port, a step)."""

    role: str
    pool: str | None
    message: str
    hint: str | None = None
    #: An exception kvagent did not expect (a bug): counted apart by the agent.
    unexpected: bool = False


@dataclass(frozen=True)
class WarningRecord:
    """Something worth an operator's look that did not stop any work."""

    role: str
    pool: str | None
    message: str


#: The hint of an unexpected error.
UNEXPECTED_HINT = ("this is a kvagent bug: the agent's log has the traceback; the next pass "
                   "retries; please report it")


@dataclass
class RunResult:
    """The outcome of ``kvagent plan`` or ``kvagent apply``."""

    dry_run: bool
    actions: list[ActionRecord] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    warnings: list[WarningRecord] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    configfs_writes: int = 0

    @property
    def changed(self) -> bool:
        wanted = "planned" if self.dry_run else "done"
        return any(a.status == wanted for a in self.actions)

    @property
    def ok(self) -> bool:
        return not self.errors and not any(a.status == "failed" for a in self.actions)

    def error(self, role: str, pool: str | None, message: str, hint: str | None = None) -> None:
        self.errors.append(ErrorRecord(role, pool, message, hint))

    def warn(self, role: str, pool: str | None, message: str) -> None:
        """Record a warning (once: a pass that meets it twice reports it once)."""
        record = WarningRecord(role, pool, message)
        if record not in self.warnings:
            self.warnings.append(record)

    def unexpected(self, role: str, pool: str | None, exc: BaseException,
                   context: str = "") -> None:
        """Record an exception kvagent did not expect (the caller logs its traceback)."""
        self.errors.append(ErrorRecord(
            role, pool, f"{context}unexpected error: {type(exc).__name__}: {exc}",
            UNEXPECTED_HINT, unexpected=True))

    @property
    def unexpected_errors(self) -> int:
        """How many of the errors were unexpected exceptions."""
        return sum(1 for e in self.errors if e.unexpected)

    def to_json(self) -> dict:
        return {
            "changed": self.changed,
            "ok": self.ok,
            "dry_run": self.dry_run,
            "actions": [a.__dict__ for a in self.actions],
            "errors": [e.__dict__ for e in self.errors],
            "warnings": [w.__dict__ for w in self.warnings],
            "configfs_writes": self.configfs_writes,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_json(cls, data: dict) -> RunResult:
        """The result :meth:`to_json` wrote (e.g. the agent's answer to ``kvagent apply``)."""
        return cls(dry_run=bool(data["dry_run"]),
                   actions=[ActionRecord(**a) for a in data.get("actions", [])],
                   errors=[ErrorRecord(**e) for e in data.get("errors", [])],
                   warnings=[WarningRecord(**w) for w in data.get("warnings", [])],
                   started_at=float(data["started_at"]), finished_at=data.get("finished_at"),
                   configfs_writes=int(data.get("configfs_writes", 0)))
