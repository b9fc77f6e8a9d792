"""Loading kernel modules (only those not loaded yet: modprobe costs time on every pass)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..log import get_logger
from .run import Runner

log = get_logger("modules")
#: The system calls modprobe, which this module runs (and the unit's ExecStartPre=),
#: makes for it: finit_module, or init_module for a module it decompressed itself. The
#: unit's SystemCallFilter must allow them (@module;
#: tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("finit_module", "init_module")


def is_loaded(module: str, sysfs: str | Path = "/sys") -> bool:
    """Whether ``module`` (or a built-in of that name) is present in ``<sysfs>/module``."""
    return (Path(sysfs) / "module" / module.replace("-", "_")).is_dir()


def ensure_modules(modules: Iterable[str], runner: Runner, sysfs: str | Path = "/sys") -> None:
    """modprobe each module that is not loaded; a failure is logged, not raised.

    (The operation that needs the module then fails with its own clear error.)
    """
    for module in modules:
        if is_loaded(module, sysfs):
            continue
        result = runner(["modprobe", module], timeout=60, check=False)
        if not result.ok:
            log.warning("modprobe failed", module=module, error=result.stderr.strip())
