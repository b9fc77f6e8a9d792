"""What the stages of one GPU-host pass share: the pass's context (config, runner,
result, sysfs, nvme-cli, the host seams, the pool's checkpoint), and the volume that
:mod:`.layout` hands to :mod:`.filesystem` and :mod:`.mount`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ... import effects, progress
from ...config.model import Config
from ...immutable import is_immutable
from ...result import ActionRecord, RunResult
from ...system.mountusers import MountUser, mount_users
from ...system.run import Runner
from ..filesystem import XfsSuperblock, read_xfs_superblock
from ..kernel_quirks import thp_mode
from ..mounts import MOUNTINFO, device_number
from ..nvme.cli import NvmeCli
from ..striped import volume_slaves
from ..sysfs import Sysfs
from ..xfsmount import Geometry, geometry, is_shut_down


@dataclass(frozen=True)
class HostSeams:
    """The GPU host's external effects that are not commands (tests replace them)."""

    mountinfo: Path = MOUNTINFO
    devnum: Callable[[str], str] = device_number
    exists: Callable[[str], bool] = os.path.exists
    superblock: Callable[[str], XfsSuperblock | None] = read_xfs_superblock
    volume_slaves: Callable[[str], frozenset[str] | None] = volume_slaves
    sleep: Callable[[float], None] = progress.sleep  # ends early on SIGTERM
    clock: Callable[[], float] = time.monotonic
    wallclock: Callable[[], float] = time.time
    shut_down: Callable[[str], bool] = is_shut_down
    geometry: Callable[[str], Geometry] = geometry
    users: Callable[[str], list[MountUser]] = mount_users
    thp: Callable[[], str | None] = thp_mode
    #: A directory's immutable attribute (None: its filesystem has none) and the effect
    #: that sets or clears it (agent.immutable).
    sealed: Callable[[str], bool | None] = is_immutable
    seal: Callable[[str, bool], None] = effects.seal_dir


def _nothing() -> None:
    return None


@dataclass
class StageContext:
    """One pass of the GPU-host role as every stage sees it.

    ``checkpoint`` records what the attach of the pool in hand has done (or is about to
    do) so far; the orchestration sets it for each pool.
    """

    cfg: Config
    runner: Runner
    result: RunResult
    dry_run: bool
    sysfs: Sysfs
    cli: NvmeCli
    seams: HostSeams
    checkpoint: Callable[[], None] = field(default=_nothing)
    #: False: controllers that are all reconnecting are not waited for (the agent's
    #: passes; :func:`agent.reconcile.run_pass`).
    wait_reconnects: bool = True
    _thp: list[str | None] = field(default_factory=list, repr=False)

    def thp_mode(self) -> str | None:
        """The host's transparent-huge-page mode (:func:`~..kernel_quirks.thp_mode`),
        read once per pass: every pool's discovery asks, and the answer is host-wide."""
        if not self._thp:
            self._thp.append(self.seams.thp())
        return self._thp[0]

    def act(self, pool: str | None, kind: str, subject: str, detail: str = "",
            status: str | None = None) -> None:
        """Report an action of the initiator role (planned in a dry run, else done)."""
        self.result.actions.append(ActionRecord(
            "initiator", pool, kind, subject, detail,
            status or ("planned" if self.dry_run else "done")))


class Volume(NamedTuple):
    """A block device of a pool that gets an xfs, and the directory it is mounted on."""

    device: str
    fs_uuid: str
    mount: str
    index: int  # its xfs label's number
    size: int | None  # the namespace's bytes (None: a striped volume, never grown)
