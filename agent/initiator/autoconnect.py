"""Other tools that connect NVMe-oF subsystems on their own, and the controllers they
leave on kvagent's subsystems.

Debian's nvme-cli (a dependency) ships ``70-nvmf-autoconnect.rules``: on every
discovery-log-change AEN, and whenever a persistent discovery controller reconnects,
udev starts ``nvme connect-all`` through that discovery controller, which connects
every subsystem its log offers this host. kvagent keeps such discovery controllers
(:mod:`.discovery_controllers`), so on a host where the rule is active nvme-cli
connects, next to kvagent, every subsystem a storage host offers: kvagent uses such a
controller for a pool it attaches (the kernel refuses a second one to the same
subsystem, address and host NQN), but nvme-cli also connects subsystems no pool of this
host attaches (a pool taken out of the config, another host's pool offered to this
one) and reconnects them after kvagent detached them. Those are *stray* controllers:
they hold a storage host's namespaces this host should have let go. The fix is to
mask the rule on hosts kvagent manages (docs/operations.md, "nvme-cli's autoconnect").
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..naming import parse_subsystem_nqn
from .sysfs import Controller

RULE = "70-nvmf-autoconnect.rules"
#: udev's rule directories, the overriding ones first (a file in an earlier directory
#: hides a file of the same name in the later ones).
RULE_DIRS = (Path("/etc/udev/rules.d"), Path("/run/udev/rules.d"),
             Path("/usr/lib/udev/rules.d"), Path("/lib/udev/rules.d"))
#: Why a stray controller is there, and what to do first.
AUTOCONNECT_CAUSE = ("nvme-cli's autoconnect rule is active on this host and connects "
                     "every subsystem a discovery controller offers: mask it (ln -s "
                     f"/dev/null /etc/udev/rules.d/{RULE} && udevadm control --reload)")
OTHER_CAUSE = "another tool connected it (nvme-stas, a script, by hand): stop it"


def nvme_cli_autoconnect_active(dirs: Iterable[Path] = RULE_DIRS) -> bool:
    """Whether udev runs nvme-cli's autoconnect rule here: the first ``RULE`` found in
    ``dirs`` is not a mask (a link to /dev/null, or an empty file)."""
    for d in dirs:
        rule = d / RULE
        try:
            if rule.is_symlink() and os.readlink(rule) == "/dev/null":
                return False
            if rule.is_file():
                return rule.stat().st_size > 0
        except OSError:
            continue
    return False


def stray_cause(dirs: Iterable[Path] = RULE_DIRS) -> str:
    """What most likely made a stray controller here, and what to do first."""
    return AUTOCONNECT_CAUSE if nvme_cli_autoconnect_active(dirs) else OTHER_CAUSE


def stray_controllers(controllers: Iterable[Controller], nqn_prefix: str,
                      pools: Iterable[str]) -> list[Controller]:
    """The controllers to kvagent's subsystems (``<nqn_prefix>:<storage host>:<pool>``,
    per host or shared) whose pool is none of this host's initiator ``pools`` (the
    pass takes a pool's subsystems from the discovery log by those names alone)."""
    wanted = set(pools)
    return sorted((c for c in controllers
                   if (parsed := parse_subsystem_nqn(nqn_prefix, c.subsysnqn)) is not None
                   and parsed[1] not in wanted), key=lambda c: c.name)
