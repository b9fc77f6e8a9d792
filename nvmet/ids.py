"""Deterministic namespace identifiers and host identity files."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

#: uuid5 namespace for kvagent's namespace uuids (fixed forever: changing it renames every device).
NAMESPACE_UUID_ROOT = uuid.UUID("3b0e5a2c-6f1d-5c8e-a7d2-6b76616765e7")


def namespace_uuid(subsystem_nqn: str, nsid: int) -> str:
    """Deterministic ``device_uuid`` for namespace ``nsid`` of a subsystem (uuid5)."""
    if nsid < 1:
        raise ValueError(f"nsid must be >= 1, got {nsid}")
    return str(uuid.uuid5(NAMESPACE_UUID_ROOT, f"{subsystem_nqn}/{nsid}"))


def namespace_nguid(subsystem_nqn: str, nsid: int) -> str:
    """Deterministic ``device_nguid`` (16 bytes, written like a uuid as configfs shows it)."""
    u = uuid.uuid5(NAMESPACE_UUID_ROOT, f"nguid:{subsystem_nqn}/{nsid}")
    return str(u)


@dataclass(frozen=True)
class HostIdentity:
    """This host's NVMe identity as nvme-cli and the kernel use it."""

    hostnqn: str | None
    hostid: str | None


def read_host_identity(nvme_dir: Path | str = "/etc/nvme") -> HostIdentity:
    """Read ``hostnqn`` and ``hostid`` from ``nvme_dir``; missing files read as None."""
    base = Path(nvme_dir)

    def _read(name: str) -> str | None:
        try:
            text = (base / name).read_text().strip()
        except FileNotFoundError:
            return None
        return text or None

    return HostIdentity(hostnqn=_read("hostnqn"), hostid=_read("hostid"))
