"""Who holds the apply lock, as kvagent records and shows it: a plain record, importable
without the lock itself (``kvagent status`` reads it from the agent's busy record)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LockHolder:
    """A process holding the apply lock, as the kernel reports it."""

    pid: int
    uid: int | None = None
    user: str | None = None
    command: str | None = None
    #: Not root, not kvagent's user: a process that should never hold kvagent's lock.
    foreign: bool = False

    def describe(self) -> str:
        """``pid 1234, user nobody, command 'sleep 600'``."""
        who = self.user if self.user is not None else (
            "?" if self.uid is None else str(self.uid))
        text = f"pid {self.pid}, user {who}"
        return text + (f", command {self.command!r}" if self.command else "")

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "uid": self.uid, "user": self.user, "command": self.command,
                "foreign": self.foreign}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> LockHolder:
        uid = data.get("uid")
        return cls(pid=int(str(data["pid"])), uid=int(str(uid)) if uid is not None else None,
                   user=str(data["user"]) if data.get("user") is not None else None,
                   command=str(data["command"]) if data.get("command") is not None else None,
                   foreign=bool(data.get("foreign")))
