"""A pool's native multipath I/O policy (``initiator.pools[].iopolicy``).

The policy is per NVMe subsystem on the GPU host (``/sys/class/nvme-subsystem/
nvme-subsys<S>/iopolicy``) and lasts as long as the subsystem does: a subsystem that
comes back after all its controllers went away starts from the kernel's default
(``nvme_core.iopolicy``), so every pass reads it and writes it only when it differs.
Reading is a sysfs read: a converged pass writes nothing and runs no command.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from ..errors import KvagentError
from .sysfs import Sysfs

#: The first Linux release with each policy (queue-depth: 6.11).
SINCE = {"numa": (4, 15), "round-robin": (5, 1), "queue-depth": (6, 11)}


@dataclass(frozen=True)
class PolicyChange:
    """A subsystem whose policy was (or, planning, would be) changed."""

    subsystem: str
    old: str | None
    new: str


def ensure_iopolicy(sysfs: Sysfs, pool: str, nqn: str, policy: str, *,
                    dry_run: bool = False) -> list[PolicyChange]:
    """Give every subsystem of ``nqn`` the policy ``policy``; the ones that needed it.

    Raises :class:`KvagentError` naming the pool, the subsystem and why when the kernel
    refuses (a policy this kernel does not have: the release that brought it) or the
    subsystem shows no policy at all (a kernel without native NVMe multipath).
    """
    changes = []
    for sub in sysfs.subsystems_of(nqn):
        if sub.iopolicy == policy:
            continue
        if sub.iopolicy is None:
            raise KvagentError(
                f"pool {pool}: {sub.name} ({nqn}) has no iopolicy: this kernel has no native "
                "NVMe multipath (CONFIG_NVME_MULTIPATH, nvme_core.multipath=Y)",
                "remove iopolicy from the pool, or boot a kernel with native NVMe multipath")
        if not dry_run:
            try:
                sysfs.set_iopolicy(sub.name, policy)
            except OSError as exc:
                raise refusal(pool, sub.name, nqn, policy, exc) from None
        changes.append(PolicyChange(sub.name, sub.iopolicy, policy))
    return changes


def refusal(pool: str, subsystem: str, nqn: str, policy: str, exc: OSError) -> KvagentError:
    """The error for a kernel that refused ``policy``: with the kernel release it needs."""
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    release = os.uname().release
    if exc.errno == errno.EINVAL and policy in SINCE:
        major, minor = SINCE[policy]
        return KvagentError(
            f"pool {pool}: the kernel refused iopolicy {policy!r} for {subsystem} ({nqn}) "
            f"({code}): {policy} needs Linux {major}.{minor} or later, and this host runs "
            f"{release}",
            f"set iopolicy to {' or '.join(p for p in SINCE if p != policy)} for pool {pool}, "
            f"or boot Linux {major}.{minor} or later; the subsystem keeps the kernel's policy "
            "meanwhile")
    return KvagentError(
        f"pool {pool}: cannot set iopolicy {policy!r} for {subsystem} ({nqn}): "
        f"{exc.strerror or exc} ({code})")
