"""Kernel behaviour an operator must know about before it bites.

NVMe/TCP over loopback (storage and GPU roles on one host) with transparent huge
pages set to ``always``: the host's O_DIRECT writes from huge-page buffers are
handed to the local target as pages spanning a huge page, and the hardened usercopy
check in nvmet-tcp's receive path stops the kernel ("usercopy: Kernel memory exposure
attempt detected from page alloc", kernel BUG at mm/usercopy.c). Seen on Debian's
6.1.0-57 with fio at queue depth 8 and 2 MiB writes; ``madvise`` avoids it. Between
separate hosts the NIC copies the data and the path is not taken.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = THP_ENABLED) -> str | None:
    """The selected transparent-huge-page mode (``always``, ``madvise``, ``never``)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def loopback_tcp_warning(transport: str, traddr: str, thp: str | None) -> str | None:
    """A warning for a loopback NVMe/TCP attach with THP ``always``; None when safe."""
    if transport != "tcp" or thp != "always":
        return None
    try:
        if not ipaddress.ip_address(traddr).is_loopback:
            return None
    except ValueError:
        return None
    return (f"NVMe/TCP to {traddr} is served by this host's own kernel target and "
            "transparent_hugepage is 'always': O_DIRECT I/O from huge pages can hit a "
            "kernel BUG in nvmet-tcp (hardened usercopy, seen on Debian 6.1); set "
            f"{THP_ENABLED} to madvise, or use RDMA or separate hosts")

