"""Stage 6, mount: a volume mounted on its directory, and a mounted one kept healthy.

The directories a mount needs are recorded (``PoolAttachment.created_dirs``) before
they are made; the mount has project quotas (the engines' hard caps). A pool already
mounted is looked at instead: an xfs that shut down in an outage, or one orphaned (still
mounted from a block device that is gone: its namespace went away while it was mounted,
and came back as a new device), is unmounted (never lazily) and mounted again (log
recovery, counted in ``PoolAttachment.recoveries``), one mounted without project quotas
(by an older kvagent) is mounted again with them while nothing holds it, and one whose
namespace grew is grown (:mod:`agent.initiator.xfsmount`).

Before anything is mounted on a mount point, the directory itself is sealed (made
immutable: :mod:`agent.immutable`), so that while the pool is not mounted
(before the agent's first pass after a boot, after an outage unmounted it) an engine's
writes there fail with EPERM instead of filling the host's root filesystem.
"""

from __future__ import annotations

from ...config.model import InitiatorPool
from ...errors import KvagentError
from ...log import get_logger
from ...records import PoolAttachment
from ...system.xfsquota import project_quota_mode, wants_project_quota, with_project_quota
from ..mounts import (
    QUOTACHECK_TIMEOUT,
    MountBusy,
    create_mount_point,
    device_gone,
    ensure_mounted,
    missing_dirs,
    mounted_at,
    unmount,
)
from ..xfsmount import grow, needs_growth
from .context import StageContext, Volume

log = get_logger("initiator")


def mount_volume(ctx: StageContext, pool: InitiatorPool, v: Volume,
                 record: PoolAttachment) -> None:
    """``v`` mounted on its directory (made and recorded when missing); a mounted one
    recovered or grown where needed (:func:`_mounted`)."""
    current = mounted_at(v.mount, ctx.seams.mountinfo)
    if current is not None and device_gone(current.device, ctx.cfg.node.sysfs):
        # Orphaned: the mount's own directory, recorded by this pool, on a device that is
        # gone; the namespace is back as v.device.
        _recover(ctx, pool, v.device, v.mount, record,
                 why=f"lost its device ({current.source}, {current.device}): the "
                     "namespace went away while it was mounted")
        if ctx.dry_run:
            return
    if ctx.dry_run:
        if mounted_at(v.mount, ctx.seams.mountinfo) is None:
            ctx.act(pool.name, "mount", v.mount, v.device)
        else:
            _mounted(ctx, pool, v.device, v.mount, v.size, record)
        return
    if mounted_at(v.mount, ctx.seams.mountinfo) is None:
        missing = missing_dirs(v.mount)
        if missing:
            record.created_dirs += missing  # recorded before they are made
            ctx.checkpoint()
        create_mount_point(v.mount)
        seal_mount_point(ctx, pool.name, v.mount)
    options = with_project_quota(pool.mount_options)
    if ensure_mounted(v.device, v.mount, options, ctx.runner, ctx.seams.mountinfo,
                      ctx.seams.devnum, timeout=QUOTACHECK_TIMEOUT
                      if wants_project_quota(options) else 120):
        ctx.act(pool.name, "mount", v.mount, v.device)
    _mounted(ctx, pool, v.device, v.mount, v.size, record)


def seal_mount_point(ctx: StageContext, pool: str, mount: str) -> None:
    """Make the directory ``mount`` immutable while nothing is mounted on it (read first:
    a sealed one is left alone). Where the filesystem has no such attribute, or the
    agent may not set it (no CAP_LINUX_IMMUTABLE), the mount goes ahead unsealed."""
    try:
        if ctx.seams.sealed(mount) is not False:
            return
        ctx.seams.seal(mount, True)
    except OSError as exc:
        log.info("mount point left writable while unmounted: its immutable attribute "
                 "cannot be set", pool=pool, mount=mount, error=str(exc))
        return
    log.info("sealed the mount point: nothing can be written into it while the pool is "
             "not mounted on it", pool=pool, mount=mount)


def _remount_for_quota(ctx: StageContext, pool: InitiatorPool, device: str,
                       mount: str) -> None:
    """A pool mounted without project quotas (by an older kvagent) is unmounted and
    mounted again with them: xfs turns quota accounting on only at mount time.
    Never lazily: while anything holds the mount it is left as it is (logged; health
    reports the caps advisory) and the next pass tries again."""
    options = with_project_quota(pool.mount_options)
    entry = mounted_at(mount, ctx.seams.mountinfo)
    if entry is None or not wants_project_quota(options) or \
            project_quota_mode(entry) != "off":
        return
    detail = f"{device} again with {','.join(options)} (project quotas: hard engine caps)"
    if ctx.dry_run:
        ctx.act(pool.name, "mount", mount, detail)
        return
    try:
        unmount(mount, ctx.runner, ctx.seams.mountinfo)
    except MountBusy as exc:
        log.warning("mounted without project quotas and busy: engine caps stay advisory "
                    "until nothing holds it", pool=pool.name, mount=mount)
        ctx.act(pool.name, "mount", mount, f"{detail}: {exc.message}", status="skipped")
        return
    ctx.act(pool.name, "umount", mount, "to mount it again with project quotas")
    seal_mount_point(ctx, pool.name, mount)
    ensure_mounted(device, mount, options, ctx.runner, ctx.seams.mountinfo,
                   ctx.seams.devnum, timeout=QUOTACHECK_TIMEOUT)
    ctx.act(pool.name, "mount", mount, detail)


def _mounted(ctx: StageContext, pool: InitiatorPool, device: str, mount: str,
             size: int | None, record: PoolAttachment) -> None:
    """A mounted pool filesystem: mounted again if it shut down in an outage (once a
    controller is live again: the caller made sure), grown if its namespace grew."""
    if ctx.seams.shut_down(mount):
        _recover(ctx, pool, device, mount, record)
        if ctx.dry_run:
            return  # nothing more to ask of it until it is mounted again
    else:
        _remount_for_quota(ctx, pool, device, mount)
    if size is None or pool.layout == "striped":
        return
    fs = ctx.seams.geometry(mount)
    if not needs_growth(size, fs):
        return
    if not ctx.dry_run:
        grow(mount, ctx.runner)
    ctx.act(pool.name, "xfs.grow", mount, f"{fs.data_bytes} -> {size} bytes ({device})")


def _recover(ctx: StageContext, pool: InitiatorPool, device: str, mount: str,
             record: PoolAttachment, *,
             why: str = "shut down after I/O errors (a storage outage)") -> None:
    """Unmount (never lazily) and mount ``device`` again on an xfs that shut down or was
    orphaned (``why``): its log is replayed, the engines' directories and data fsynced
    before the outage are back."""
    log.warning("pool filesystem lost its storage; mounting it again", pool=pool.name,
                mount=mount, device=device, why=why)
    if ctx.dry_run:
        ctx.act(pool.name, "xfs.recover", mount, f"{device}: unmount, mount (log "
                "recovery)")
        return
    try:
        unmount(mount, ctx.runner, ctx.seams.mountinfo)
    except MountBusy:
        users = ctx.seams.users(mount)
        who = ", ".join(u.describe() for u in users) or "a process kvagent cannot see"
        raise KvagentError(
            f"the xfs on {mount} {why} and cannot be mounted again while it is in use: {who}",
            "every call on it fails with EIO until then; stop or restart what uses it "
            "(the engine recomputes meanwhile); kvagent mounts it again at its next pass, "
            "never lazily") from None
    seal_mount_point(ctx, pool.name, mount)
    options = with_project_quota(pool.mount_options)
    ensure_mounted(device, mount, options, ctx.runner, ctx.seams.mountinfo,
                   ctx.seams.devnum, timeout=QUOTACHECK_TIMEOUT
                   if wants_project_quota(options) else 120)
    record.recovered(mount, ctx.seams.wallclock())
    ctx.checkpoint()
    ctx.act(pool.name, "xfs.recover", mount, f"{device}: unmounted, mounted again "
            "(log recovery)")
