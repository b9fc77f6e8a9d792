"""Attribute files and defaults of every nvmet object kind on the running kernel.

``python -m tests.kernel.capture_profile > profile.json`` in the VM (as root) writes the
capture kept in ``tests/unit/nvmet/fixtures/kernel-<version>/profile.json``; the kernel
tier compares the fake's profile with a fresh capture on every run.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from typing import Any

NVMET = "/sys/kernel/config/nvmet"
HOST = "nqn.2014-08.org.example:capture-host"
SUB = "nqn.2014-08.org.example:capture-sub"
PORT = "ports/9"
#: Objects created (in order) and removed (in reverse) around the capture.
OBJECTS = (f"hosts/{HOST}", f"subsystems/{SUB}", f"subsystems/{SUB}/namespaces/1", PORT,
           f"{PORT}/ana_groups/2", f"{PORT}/referrals/r")


def _files(path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted(os.listdir(path)):
        st = os.lstat(f"{path}/{name}")
        if not stat.S_ISREG(st.st_mode):
            continue
        try:
            with open(f"{path}/{name}") as f:
                value: Any = f.read().rstrip("\n")
        except OSError as exc:
            value = {"errno": errno.errorcode[exc.errno or 0]}
        out[name] = {"mode": oct(stat.S_IMODE(st.st_mode)), "value": value}
    return out


def _dirs(path: str) -> list[str]:
    return sorted(e for e in os.listdir(path) if os.path.isdir(f"{path}/{e}"))


def capture(root: str = NVMET) -> dict[str, Any]:
    """Create one object of each kind, read every attribute file, remove them again."""
    made: list[str] = []
    try:
        for rel in OBJECTS:
            os.mkdir(f"{root}/{rel}")
            made.append(rel)
        passthru = f"{root}/subsystems/{SUB}/passthru"
        return {
            "kernel": os.uname().release, "entries": sorted(os.listdir(root)),
            "root": _files(root),
            "host": _files(f"{root}/hosts/{HOST}"),
            "passthru": _files(passthru) if os.path.isdir(passthru) else None,
            "subsystem": _files(f"{root}/subsystems/{SUB}"),
            "subsystem_dirs": _dirs(f"{root}/subsystems/{SUB}"),
            "namespace": _files(f"{root}/subsystems/{SUB}/namespaces/1"),
            "port": _files(f"{root}/{PORT}"), "port_dirs": _dirs(f"{root}/{PORT}"),
            "ana_group": _files(f"{root}/{PORT}/ana_groups/2"),
            "referral": _files(f"{root}/{PORT}/referrals/r"),
        }
    finally:
        for rel in reversed(made):
            os.rmdir(f"{root}/{rel}")


if __name__ == "__main__":
    json.dump(capture(), sys.stdout, indent=1, sort_keys=True)
