"""Names kvagent derives for the objects it creates (NQNs, LV names, tags)."""

from __future__ import annotations

import uuid

#: LVM tag every kvagent-created logical volume / volume group carries.
LVM_OWNER_TAG = "kvagent"
#: uuid namespace for filesystem uuids on GPU hosts (uuid5 of host NQN + namespace uuid).
_FS_UUID_NAMESPACE = uuid.UUID("6d1f5d8e-2f1c-5a4e-9c1b-6b7661676e74")


def subsystem_nqn(prefix: str, node: str, pool: str, host: str | None) -> str:
    """NQN of a pool's subsystem: ``<prefix>:<node>:<pool>:<host>`` (or without host if shared)."""
    parts = [prefix, node, pool] + ([host] if host else [])
    return ":".join(parts)


def parse_subsystem_nqn(prefix: str, nqn: str) -> tuple[str, str, str | None] | None:
    """Inverse of :func:`subsystem_nqn`: ``(node, pool, host|None)`` or None if not ours."""
    if not nqn.startswith(prefix + ":"):
        return None
    parts = nqn[len(prefix) + 1 :].split(":")
    if len(parts) == 2:
        return parts[0], parts[1], None
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    return None


def lv_name(pool: str, host: str | None, index: int) -> str:
    """Logical volume name for namespace ``index`` (1-based) of a pool's host share."""
    return f"kv_{pool}_{host or 'shared'}_{index}"


def lv_tags(pool: str, host: str | None, index: int) -> tuple[str, ...]:
    """Tags that make a logical volume provably kvagent's."""
    return (LVM_OWNER_TAG, f"kvagent_pool={pool}", f"kvagent_host={host or '-'}",
            f"kvagent_ns={index}")


def filesystem_uuid(host_nqn: str, namespace_uuid: str) -> uuid.UUID:
    """The xfs uuid this host writes on a namespace: provable ownership on the GPU host."""
    return uuid.uuid5(_FS_UUID_NAMESPACE, f"{host_nqn}\n{namespace_uuid.lower()}")
