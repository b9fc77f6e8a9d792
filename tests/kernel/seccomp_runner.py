"""kvagent's project-quota calls under a seccomp allow-list like the unit's (run as a FILE).

    python seccomp_runner.py MOUNT PROJID BYTES < ALLOWED.json

ALLOWED.json is a JSON list of system call names, or null for no filter. The filter is
what ``SystemCallFilter=<those>`` with ``SystemCallErrorNumber=EPERM`` and
``SystemCallArchitectures=native`` makes systemd load: a call not on the list fails
with EPERM, other architectures' calls are refused. It is loaded through libseccomp
(the library systemd uses) before kvagent is imported; then kvagent's own functions set
project PROJID's hard limit to BYTES on the xfs at MOUNT and read it back. Prints one
JSON line: ``{"ok": true, "hard": N}`` or ``{"ok": false, "errno": E, "error": "..."}``.
(tests/kernel/test_unit_seccomp.py)
"""

from __future__ import annotations

import ctypes
import errno
import json
import sys

SCMP_ACT_ALLOW = 0x7FFF0000


def scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


def load_filter(allowed: list[str]) -> int:
    """Load the allow-list; returns how many of the names this architecture has."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                     ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(scmp_act_errno(errno.EPERM))
    assert ctx, "seccomp_init failed"
    native = 0
    for name in allowed:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # not a system call of this architecture (systemd skips it too)
            continue
        rc = lib.seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0)
        assert rc == 0, f"seccomp_rule_add({name}) = {rc}"
        native += 1
    rc = lib.seccomp_load(ctx)
    assert rc == 0, f"seccomp_load = {rc}"
    return native


def main() -> None:
    mount, projid, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    allowed = json.load(sys.stdin)
    if allowed is not None:
        load_filter(allowed)
    from agent.system.xfsquota import QuotaUnavailable, get_quota, set_hard_limit

    try:
        set_hard_limit(mount, projid, size)
        quota = get_quota(mount, projid)
    except QuotaUnavailable as exc:
        print(json.dumps({"ok": False, "errno": exc.errno, "error": exc.message}))
        return
    print(json.dumps({"ok": True, "hard": quota.hard_limit_bytes}))


if __name__ == "__main__":
    main()
