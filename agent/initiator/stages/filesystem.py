"""Stage 5, filesystem: an xfs on a volume, made only on a blank device.

A device that already has this host's own xfs (its uuid derives from the namespace's)
is kept as it is, recognised from its superblock without running ``blkid``; anything
else on it is foreign and refused (:mod:`agent.initiator.filesystem`). A device mounted
on the volume's own directory is not read at all: kvagent mounted it there once its xfs
was found to be this host's, and a mounted device is never formatted (an attach pass for
one namespace added read every other namespace's superblock over the fabric first).
"""

from __future__ import annotations

from ...config.model import InitiatorPool
from ..filesystem import ensure_filesystem, needs_filesystem, probe_content, xfs_label
from ..mounts import mounted_at
from .context import StageContext, Volume


def make_filesystem(ctx: StageContext, pool: InitiatorPool, v: Volume) -> None:
    """xfs on a blank device (a device with this host's own xfs is kept as it is)."""
    current = mounted_at(v.mount, ctx.seams.mountinfo)
    if current is not None and ctx.seams.exists(v.device) and \
            current.device == ctx.seams.devnum(v.device):
        return
    if ctx.dry_run:
        fresh = pool.layout == "striped" and not ctx.seams.exists(v.device)
        if fresh or needs_filesystem(probe_content(v.device, ctx.runner,
                                                   exists=ctx.seams.exists), v.fs_uuid):
            ctx.act(pool.name, "mkfs.xfs", v.device, f"uuid {v.fs_uuid}")
        return
    if ensure_filesystem(v.device, v.fs_uuid, xfs_label(pool.name, v.index), ctx.runner,
                         superblock=ctx.seams.superblock, exists=ctx.seams.exists):
        ctx.act(pool.name, "mkfs.xfs", v.device, f"uuid {v.fs_uuid}")
