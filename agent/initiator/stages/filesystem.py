"""Stage 5, filesystem: an xfs on a volume, made only on a blank device.

A device that already has this host's own xfs (its uuid derives from the namespace's)
is kept as it is, recognised from its superblock without running ``blkid``; anything
else on it is foreign and refused (:mod:`agent.initiator.filesystem`).
"""

from __future__ import annotations

from ...config.model import InitiatorPool
from ..filesystem import ensure_filesystem, needs_filesystem, probe_content, xfs_label
from .context import StageContext, Volume


def make_filesystem(ctx: StageContext, pool: InitiatorPool, v: Volume) -> None:
    """xfs on a blank device (a device with this host's own xfs is kept as it is)."""
    if ctx.dry_run:
        fresh = pool.layout == "striped" and not ctx.seams.exists(v.device)
        if fresh or needs_filesystem(probe_content(v.device, ctx.runner,
                                                   exists=ctx.seams.exists), v.fs_uuid):
            ctx.act(pool.name, "mkfs.xfs", v.device, f"uuid {v.fs_uuid}")
        return
    if ensure_filesystem(v.device, v.fs_uuid, xfs_label(pool.name, v.index), ctx.runner,
                         superblock=ctx.seams.superblock, exists=ctx.seams.exists):
        ctx.act(pool.name, "mkfs.xfs", v.device, f"uuid {v.fs_uuid}")
