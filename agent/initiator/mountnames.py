"""Where each namespace of a per-namespace pool is mounted: named by stable identity.

A namespace is mounted at ``<mount>/<storage node>-ns<nsid>``: the storage host's node
name from its subsystem NQN (``<prefix>:<node>:<pool>[:<host>]``) and the namespace id,
which the storage host never reuses for other storage under the same identity. A
subsystem NQN outside ``node.nqn_prefix`` (a ``subsystem`` given in the config) gives
``s<8 hex of its SHA-256>-ns<nsid>``. Nothing depends on the order in which subsystems
are listed, so one storage host adding namespaces never moves another's.

Once a namespace is mounted its directory is recorded with it (by its uuid, in
``initiator.json``) and kept for good: pools attached before this naming keep their
``<mount>/ns1..nsN``, and a namespace added later gets the stable name beside them.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence

from ..errors import KvagentError
from ..naming import parse_subsystem_nqn
from ..records import PoolAttachment
from .devices import NamespaceDevice

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def hashed_label(subsysnqn: str) -> str:
    """``s`` and 8 hex digits of the NQN's SHA-256: short, stable, safe in a path."""
    return "s" + hashlib.sha256(subsysnqn.encode()).hexdigest()[:8]


def storage_label(nqn_prefix: str, subsysnqn: str) -> str:
    """The storage host's node name in ``subsysnqn`` (or :func:`hashed_label`)."""
    parsed = parse_subsystem_nqn(nqn_prefix, subsysnqn)
    if parsed is not None and _LABEL.match(parsed[0]):
        return parsed[0]
    return hashed_label(subsysnqn)


def stable_mount(root: str, nqn_prefix: str, subsysnqn: str, nsid: int) -> str:
    """``<root>/<storage node>-ns<nsid>``."""
    return os.path.join(root, f"{storage_label(nqn_prefix, subsysnqn)}-ns{nsid}")


def assign_mounts(root: str, nqn_prefix: str, devices: Sequence[NamespaceDevice],
                  old: PoolAttachment | None,
                  mounted_on: Callable[[NamespaceDevice], str | None] = lambda d: None,
                  ) -> list[str]:
    """One mount directory per device, in ``devices`` order.

    A device keeps the directory recorded for its namespace (by uuid) while that is
    under ``root``; else the one of the old record's directories it is mounted on now
    (``mounted_on``: a record from before devices named their mount, left half-done);
    else its stable name. Two devices never share a directory.
    """
    out: list[str | None] = [None] * len(devices)
    taken: set[str] = set()
    norm = os.path.normpath(root)

    def ours(path: str | None) -> bool:
        return path is not None and os.path.dirname(os.path.normpath(path)) == norm \
            and path not in taken

    for i, d in enumerate(devices):
        recorded = old.device_mount(d.uuid) if old is not None else None
        if ours(recorded):
            assert recorded is not None
            out[i] = recorded
            taken.add(recorded)
    for i, d in enumerate(devices):
        if out[i] is None:
            current = mounted_on(d)
            if ours(current):
                assert current is not None
                out[i] = current
                taken.add(current)
    for i, d in enumerate(devices):
        if out[i] is not None:
            continue
        for path in (stable_mount(root, nqn_prefix, d.subsysnqn, d.nsid),
                     os.path.join(root, f"{hashed_label(d.subsysnqn)}-ns{d.nsid}")):
            if path not in taken:
                out[i] = path
                taken.add(path)
                break
        else:
            raise KvagentError(f"no free mount directory for nsid {d.nsid} of {d.subsysnqn} "
                               f"under {root}",
                               "two subsystems of the pool name the same storage node: give "
                               "each target its own subsystem")
    return [m for m in out if m is not None]
