"""The unit's SystemCallFilter as systemd expands it, and the system calls kvagent declares.

systemd-analyze prints systemd's own syscall groups (``systemd-analyze syscall-filter``,
package ``systemd``): the unit's ``@group`` names are expanded with those tables, not
with a copy of them, so the check follows the systemd it runs on. kvagent's modules
that call the kernel past Python's own wrappers (ctypes, ioctl, flock, mmap, netlink)
or run a command for a privileged call (mount(8), modprobe) declare the calls in a
module-level ``SYSCALLS`` tuple, read here from the source (nothing is imported).

Shared by tests/unit/health/test_systemd_syscalls.py (every declared call is allowed)
and tests/kernel/test_unit_seccomp.py (the quota calls under a seccomp filter built
from the expanded list, on a real xfs).
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "kvagent.service"
#: kvagent's code (the nvmet package and the agent).
SOURCES = (ROOT / "agent", ROOT / "nvmet")


def analyze() -> str:
    """systemd-analyze's path; the test FAILS (never skips) without it."""
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail("systemd-analyze is not installed: install the 'systemd' package "
                    "(scripts/setup does); the unit's syscall checks must not be skipped")
    return path


@functools.cache
def syscall_groups() -> dict[str, frozenset[str]]:
    """systemd's syscall groups, ``{"@mount": {"mount", ...}, ...}``; members may be
    groups themselves (``@system-service`` holds ``@file-system``)."""
    proc = subprocess.run([analyze(), "syscall-filter", "--no-pager"], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
                               "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
    assert proc.returncode == 0, proc.stderr
    groups: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in proc.stdout.splitlines():
        if re.fullmatch(r"@[\w-]+", line):
            current = groups.setdefault(line, set())
        elif not line.strip():
            current = None
        elif current is not None and line.startswith(" ") and not line.strip().startswith("#"):
            current.add(line.strip())
    assert {"@system-service", "@privileged", "@known", "@mount", "@module"} <= set(groups), \
        f"systemd-analyze syscall-filter printed no usable tables:\n{proc.stdout[:2000]}"
    return {name: frozenset(members) for name, members in groups.items()}


def expand(names: list[str] | tuple[str, ...] | set[str]) -> set[str]:
    """System call names of ``names`` (system calls and ``@groups``), groups expanded."""
    groups = syscall_groups()
    out: set[str] = set()
    pending = list(names)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.startswith("@"):
            assert name in groups, f"this systemd knows no system call group {name}"
            pending.extend(groups[name])
        else:
            out.add(name)
    return out


def unit_filter(text: str) -> list[str]:
    """The entries of the unit's ``SystemCallFilter=`` lines (an allow-list), in order;
    an empty assignment resets the list, as systemd reads it."""
    entries: list[str] = []
    for line in text.splitlines():
        m = re.fullmatch(r"SystemCallFilter=(.*)", line.strip())
        if not m:
            continue
        value = m.group(1).split()
        if not value:
            entries = []
            continue
        assert not value[0].startswith("~"), \
            "the unit's SystemCallFilter is an allow-list; a deny-list here needs new checks"
        entries += value
    return entries


def allowed_by(text: str) -> set[str]:
    """Every system call a unit's SystemCallFilter allows, per this host's systemd."""
    return expand(unit_filter(text))


def declared() -> dict[str, tuple[str, ...]]:
    """``SYSCALLS`` of every module of kvagent that declares it: {relative path: calls}."""
    out: dict[str, tuple[str, ...]] = {}
    for path, tree in modules():
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else \
                node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and target.id == "SYSCALLS":
                value = ast.literal_eval(node.value)  # type: ignore[arg-type]
                assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), \
                    f"{path}: SYSCALLS must be a tuple of system call names"
                out[path] = value
    return out


@functools.cache
def modules() -> tuple[tuple[str, ast.Module], ...]:
    """(relative path, parsed module) of every Python file of kvagent."""
    return tuple((str(path.relative_to(ROOT)), ast.parse(path.read_text()))
                 for source in SOURCES for path in sorted(source.rglob("*.py")))
