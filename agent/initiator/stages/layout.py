"""Stage 4, layout: what gets a filesystem, and where it is mounted.

A per-namespace pool mounts each namespace on the directory :mod:`.find` recorded for
it; a striped pool mounts one striped LVM volume over all of them (made here:
:mod:`agent.initiator.striped`) on the pool's mount. The mounts are recorded
(``PoolAttachment.mounts``) before anything is made. Each xfs's uuid derives from this
host's NQN and the namespaces' identity, so only this host would have written it; a
volume smaller than xfs's minimum is refused.
"""

from __future__ import annotations

from ...config.model import XFS_MIN_BYTES, InitiatorPool
from ...errors import KvagentError
from ...naming import filesystem_uuid
from ...records import PoolAttachment
from ..devices import NamespaceDevice
from ..striped import ensure_striped_volume, volume_path
from .context import StageContext, Volume


def pool_volumes(ctx: StageContext, pool: InitiatorPool, hostnqn: str,
                 devices: list[NamespaceDevice], record: PoolAttachment) -> list[Volume]:
    """What gets a filesystem and where it is mounted: each namespace on its recorded
    directory, or the striped volume (made here) on the pool's mount. The mounts are
    recorded first."""
    if pool.layout == "striped":
        total = sum(d.size_bytes or 0 for d in devices)
        uuids = ",".join(sorted(d.uuid for d in devices))
        fs_uuid = str(filesystem_uuid(hostnqn, f"striped:{pool.name}:{uuids}"))
        _check_size(pool, "the striped volume", total)
        record.mounts = [pool.mount]
        ctx.checkpoint()
        return [Volume(_striped(ctx, pool, devices), fs_uuid, pool.mount, 1, None)]
    for d in devices:
        _check_size(pool, f"{d.device} (nsid {d.nsid})", d.size_bytes)
    where = {(a.subsysnqn, a.nsid): a.mount for a in record.devices}
    mounts = [str(where[(d.subsysnqn, d.nsid)]) for d in devices]
    record.mounts = list(mounts)
    ctx.checkpoint()
    return [Volume(d.device, str(filesystem_uuid(hostnqn, d.uuid)), m, i, d.size_bytes)
            for i, (d, m) in enumerate(zip(devices, mounts, strict=True), 1)]


def _check_size(pool: InitiatorPool, what: str, size: int | None) -> None:
    if size is not None and size < XFS_MIN_BYTES:
        raise KvagentError(
            f"pool {pool.name}: {what} has {size} bytes; xfs needs at least "
            f"{XFS_MIN_BYTES} bytes (300 MB)",
            "make the pool's namespaces bigger on the storage host (namespaces.size)")


def _striped(ctx: StageContext, pool: InitiatorPool, devices: list[NamespaceDevice]) -> str:
    if ctx.dry_run:
        return volume_path(pool.name)
    path, created = ensure_striped_volume(pool.name, [d.device for d in devices],
                                          ctx.runner, exists=ctx.seams.exists,
                                          slaves=ctx.seams.volume_slaves)
    if created:
        ctx.act(pool.name, "lvm.striped", path, f"{len(devices)} stripes")
    return path
