"""The way back: a pool's mounts unmounted and its controllers disconnected.

For a pool dropped from the config (:func:`detach_pool`), and for what an earlier
attach did that the config no longer asks for (:func:`drop_stale`). Only what the
record shows kvagent made: filesystems on the pool's own devices (never lazily, and
never while no controller of the pool is live: umount would wait on storage that does
not answer), this host identity's controllers of the recorded subsystems, and the
mount directories kvagent created, when empty.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from ...errors import KvagentError
from ...fabrics import FabricsAddress
from ...log import get_logger
from ...records import PoolAttachment, SubsystemPath
from ...system.mountusers import MountUser
from ..connect import disconnect_controllers
from ..mounts import MountEntry, mounted_at, remove_mount_points, unmount
from ..striped import deactivate, dm_name, volume_path
from ..sysfs import read_attr
from .context import StageContext

log = get_logger("initiator")


def detach_pool(ctx: StageContext, name: str, record: PoolAttachment) -> None:
    """Unmount, deactivate (striped) and disconnect what ``record`` says pool ``name``
    has; remove the mount directories kvagent created."""
    _unmount_all(ctx, name, record.mounts, record)
    striped = record.layout == "striped"
    if striped and (ctx.dry_run or deactivate(name, ctx.runner)):
        ctx.act(name, "lvm.deactivate", volume_path(name))
    _disconnect_all(ctx, name, record.subsystems, record.hostnqn)
    if ctx.dry_run:
        return
    removable = record.removable_dirs()
    for d in sorted(set(record.created_dirs) - set(removable)):
        log.warning("kept a recorded directory that is no mount of the pool",
                    pool=name, directory=d)
    removed = remove_mount_points(removable, ctx.seams.mountinfo, sealed=ctx.seams.sealed,
                                  seal=ctx.seams.seal)
    for d in removed:
        ctx.act(name, "rmdir", d, "mount directory kvagent created")


def drop_stale(ctx: StageContext, name: str, old: PoolAttachment, new: PoolAttachment,
               unread: Collection[FabricsAddress] = ()) -> dict[str, list[MountUser]]:
    """Undo what an earlier attach did that the config (or the storage hosts: one that
    left the mesh, a subsystem no longer offered) no longer asks for. Nothing recorded at
    a port whose discovery log this pass could not read (``unread``) is stale: what that
    storage host offers is unknown, not nothing.

    A stale mount some process still uses (an engine that has not restarted since its
    config left the mount out) is not unmounted, nor are its namespace's controllers
    disconnected: it goes into ``new`` as ``old`` had it, to be let go by a later pass
    once nothing holds it. Returns those mounts with the processes that hold them."""
    held = {s.subsysnqn for s in old.subsystems if s.address in unread}
    held_mounts = {d.mount for d in old.devices if d.subsysnqn in held}
    stale_mounts = [m for m in old.mounts if m not in new.mounts and m not in held_mounts]
    busy = {}
    if not ctx.dry_run:
        busy = {m: users for m in stale_mounts
                if mounted_at(m, ctx.seams.mountinfo) is not None and (users := ctx.seams.users(m))}
    if busy:
        held |= {d.subsysnqn for d in old.devices if d.mount in busy}
        devices = [d for d in old.devices if d.subsysnqn in held]
        new.devices = list(dict.fromkeys([*new.devices, *devices]))
        new.mounts = list(dict.fromkeys([*new.mounts, *(m for m in old.mounts if m in busy)]))
        new.subsystems = list(dict.fromkeys(
            [*new.subsystems, *(s for s in old.subsystems if s.subsysnqn in held)]))
    _unmount_all(ctx, name, [m for m in stale_mounts if m not in busy], old)
    keep = {s.subsysnqn for s in new.subsystems} | held
    stale = [s for s in old.subsystems if s.subsysnqn not in keep]
    _disconnect_all(ctx, name, stale, old.hostnqn)
    return busy


def _unmount_all(ctx: StageContext, name: str, mounts: list[str],
                 record: PoolAttachment) -> None:
    for mount in reversed(mounts):
        entry = mounted_at(mount, ctx.seams.mountinfo)
        if entry is None:
            continue
        if not _is_pool_mount(ctx, name, entry, record):
            raise KvagentError(
                f"not unmounting {mount}: {entry.source} ({entry.fstype}) is mounted there, "
                f"which is not a device of pool {name}",
                "kvagent only unmounts what it mounted; unmount it yourself if it should go")
        _check_reachable(ctx, name, mount, record)
        if ctx.dry_run or unmount(mount, ctx.runner, ctx.seams.mountinfo):
            ctx.act(name, "umount", mount)


def _check_reachable(ctx: StageContext, name: str, mount: str, record: PoolAttachment) -> None:
    """Refuse to unmount a pool none of whose controllers is live.

    Unmounting flushes the filesystem; with the storage host gone and the kernel
    still reconnecting (``ctrl_loss_tmo``), that I/O waits — umount would hang in
    the kernel, beyond any timeout. The pool is reported instead.
    """
    subs = {s.subsysnqn for s in record.subsystems}
    ctrls = [c for c in ctx.sysfs.controllers()
             if c.subsysnqn in subs and c.hostnqn == record.hostnqn]
    if not ctrls or any(c.state == "live" for c in ctrls):
        return
    states = ", ".join(f"{c.name} {c.state}" for c in ctrls)
    raise KvagentError(
        f"not unmounting {mount} of pool {name}: no controller of the pool is live "
        f"({states}); unmounting would wait for storage that does not answer",
        "kvagent detaches once the storage host answers again; to give up on its data "
        "now, disconnect the pool's controllers (nvme disconnect -n NQN: pending I/O "
        "fails) and apply again")


def _is_pool_mount(ctx: StageContext, name: str, entry: MountEntry,
                   record: PoolAttachment) -> bool:
    dev = Path(ctx.cfg.node.sysfs) / "dev/block" / entry.device
    uuid = read_attr(dev / "uuid")
    if uuid is not None and uuid.lower() in {d.uuid.lower() for d in record.devices}:
        return True
    if record.layout == "striped" and read_attr(dev / "dm/name") == dm_name(name):
        return True
    known = {d.device for d in record.devices} | {
        volume_path(name), f"/dev/mapper/{dm_name(name)}"}
    return entry.source in known


def _disconnect_all(ctx: StageContext, name: str, subsystems: list[SubsystemPath],
                    hostnqn: str) -> None:
    for sub in subsystems:
        if ctx.dry_run:
            ctx.act(name, "nvme.disconnect", sub.subsysnqn)
            continue
        gone = disconnect_controllers(sub.subsysnqn, hostnqn, cli=ctx.cli,
                                      sysfs=ctx.sysfs)
        if gone:
            ctx.act(name, "nvme.disconnect", sub.subsysnqn, ", ".join(gone))
