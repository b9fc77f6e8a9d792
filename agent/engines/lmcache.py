"""LMCache: a YAML config file (LMCACHE_CONFIG_FILE) for its local-disk backend.

Keys (checked against LMCache/LMCache lmcache/v1/config.py, config_base.py and
storage_backend/local_disk_backend.py; see KEYS.md):
- ``local_disk``: ``file://<dir>/``. LMCache strips ``file://`` only when the
  value ends with ``/``, so the slash is always written. Several directories
  are joined with ``,`` (recent LMCache shards them per GPU).
- ``max_local_disk_size``: a float that LMCache multiplies by 1024**3 (GiB,
  although its docs say GB), per worker process.
- ``extra_config.use_odirect``: O_DIRECT for the disk files (default false).
"""

from __future__ import annotations

import math

from .base import GIB, EngineContext, Rendered, dump_yaml, odirect_failure, probe_notes

CONFIG_NAME = "lmcache.yaml"


def gib_floor(n_bytes: int) -> float:
    """Bytes as GiB, rounded down to 1/100 GiB so LMCache never exceeds the cap."""
    return math.floor(n_bytes * 100 / GIB) / 100


def render(ctx: EngineContext) -> Rendered:
    """The LMCache YAML for the engine's directories."""
    ctx.check()
    notes = probe_notes(ctx)
    dirs = ctx.directories
    workers = max(ctx.ranks, len(dirs))
    per_worker = ctx.capacity_bytes // workers
    size = gib_floor(per_worker)
    notes.append(
        f"max_local_disk_size is per LMCache worker in GiB (LMCache multiplies it by 1024**3): "
        f"{size} GiB = the engine's {ctx.capacity_bytes} bytes / {workers} worker(s)")
    if size <= 0:
        notes.append("the per-worker share is below 0.01 GiB: LMCache would store nothing")

    probes = [ctx.probe_for(d) for d in dirs]
    use_odirect = all(p is not None and p.odirect_ok for p in probes)
    for p in probes:
        if p is not None and not p.odirect_ok:
            notes.append(f"fallback: use_odirect false because {odirect_failure(p)}")
    if not use_odirect and all(p is None or p.odirect_ok for p in probes):
        notes.append("use_odirect false: not every directory was probed for O_DIRECT")

    data: dict[str, object] = {
        "local_disk": ",".join(f"file://{d}/" for d in dirs),
        "max_local_disk_size": size,
        "extra_config": {"use_odirect": use_odirect},
    }
    if len(dirs) > 1:
        data["local_disk_path_sharding"] = "by_gpu"
        notes.append(
            "several directories: local_disk is a comma-separated list with "
            "local_disk_path_sharding by_gpu, which only recent LMCache releases understand "
            "(PathSharder); older ones take a single directory: use one file per GPU then")
    if ctx.devices:
        notes.append("raw block devices are not rendered: LMCache's raw-block backend is a "
                     "separate plugin whose keys kvagent could not confirm")
    notes.append("gds_path is not rendered (GPUDirect Storage needs nvidia-fs and cuFile); set "
                 "it to the same directory yourself if you use LMCache's GDS backend")
    notes.append("LMCache evicts on disk (LRU) but keeps its index in memory (the versions "
                 "checked do not rescan at start): files of an earlier run are not counted "
                 "against max_local_disk_size; kvagent's cap is the guard (a hard limit: "
                 "the directory's xfs project quota, ENOSPC at the cap, on pools mounted "
                 "with prjquota, the default); nothing is deleted unless the engine's "
                 "cleaner is turned on (engines[].cleaner)")
    notes.append("this is LMCache's in-process configuration (LMCACHE_CONFIG_FILE); recent "
                 "LMCache calls that mode legacy and prefers its multi-process (MP) server, "
                 "whose disk settings kvagent does not render")
    return Rendered({CONFIG_NAME: dump_yaml(ctx, data)}, "yaml", tuple(notes))
