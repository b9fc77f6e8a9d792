"""Planned changes to backing storage, executed only by apply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Volume:
    """The backing of one namespace: where it is and how big it must be."""

    pool: str
    host: str | None  # None for a shared pool
    nsid: int
    path: str
    size: int | None  # None: the whole device, whatever its size
    buffered_io: bool = False


@dataclass(frozen=True)
class Step:
    """One change to backing storage (create or grow a volume, claim a device).

    ``grown`` names a volume path whose nvmet namespace must be revalidated
    after the step (the kernel re-reads the size).
    """

    kind: str
    pool: str
    subject: str
    detail: str
    run: Callable[[], None] = field(compare=False, repr=False)
    grown: str | None = None

    def describe(self) -> dict[str, str]:
        return {"kind": self.kind, "pool": self.pool, "subject": self.subject,
                "detail": self.detail}


@dataclass
class BackingPlan:
    """What a pool's backing needs: its volumes, the steps to get there, problems found."""

    volumes: list[Volume] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
