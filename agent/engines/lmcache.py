"""LMCache: a YAML config file (LMCACHE_CONFIG_FILE) for its local-disk backend.

Keys (checked against the lmcache 0.5.6 wheel: lmcache/v1/config.py, config_base.py,
storage_backend/path_sharder.py and storage_backend/local_disk_backend.py; see docs/engines.md):
- ``local_disk``: ``file://<dir>/``, several directories joined with ``,``.
  ``_parse_local_disk`` strips ``file://`` from each entry (older releases only when the
  value ended with ``/``, so the slash is always written).
- ``local_disk_path_sharding: by_gpu`` (several directories): each worker's
  ``PathSharder`` picks ``paths[device % len(paths)]``, ``device`` being the worker's CUDA
  device index (``torch.cuda.current_device()``).
- ``max_local_disk_size``: a float that LocalDiskBackend multiplies by 1024**3 (GiB,
  although its docs say GB); each worker runs its own LocalDiskBackend with that size.
- ``extra_config.use_odirect``: O_DIRECT for the disk files (default false).
"""

from __future__ import annotations

import math

from .base import (
    GIB,
    HEADROOM_PERCENT,
    EngineContext,
    Rendered,
    dump_yaml,
    engine_bytes,
    odirect_failure,
    probe_notes,
    refuse_tier_off,
)

CONFIG_NAME = "lmcache.yaml"


def gib_floor(n_bytes: int) -> float:
    """Bytes as GiB, rounded down to 1/100 GiB, such that LMCache's own
    ``int(size * 1024**3)`` never exceeds ``n_bytes`` (float rounding included)."""
    size = math.floor(n_bytes * 100 / GIB) / 100
    while size > 0 and int(size * GIB) > n_bytes:
        size = round(size - 0.01, 2)
    return max(size, 0.0)


def workers_per_directory(ctx: EngineContext) -> int:
    """The most LMCache workers that can land on one directory.

    Each of an instance's ``tensor_parallel`` ranks has the next CUDA device index
    (vLLM: ``cuda:<local rank>``), and PathSharder maps device ``d`` to
    ``paths[d % n]``: a run of ``tensor_parallel`` consecutive devices, wherever it
    starts, puts at most ``ceil(tensor_parallel / n)`` workers on one path. The
    ``data_parallel`` instances may each start at any device (separate launches often
    all start at 0), so each may add that many.
    """
    n = len(ctx.directories)
    return ctx.data_parallel * math.ceil(ctx.tensor_parallel / n)


def disk_size(ctx: EngineContext) -> tuple[float, int]:
    """``max_local_disk_size`` (GiB) and the workers per directory it was sized for: for
    every directory, that many workers × the size stay within ``engine_bytes`` of its cap.

    LMCache reads one size for every worker (one file, whichever directory PathSharder
    gives a worker), so the smallest directory's share sets it. :class:`TierOff` when a
    directory's share is below 0.01 GiB: LMCache makes no disk backend for a size of 0."""
    workers = workers_per_directory(ctx)
    shares = {d: gib_floor(engine_bytes(cap, workers))
              for d, cap in zip(ctx.directories, ctx.caps(), strict=True)}
    refuse_tier_off(ctx, "max_local_disk_size", [
        f"{d} (quota {cap} bytes) gives each of up to {workers} LMCache worker(s) on it "
        f"{engine_bytes(cap, workers)} bytes, below 0.01 GiB (0: no LocalDiskBackend)"
        for d, cap in zip(ctx.directories, ctx.caps(), strict=True) if shares[d] <= 0])
    return min(shares.values()), workers


def size_notes(ctx: EngineContext, size: float, workers: int) -> list[str]:
    """What the size assumes, in words."""
    caps = ", ".join(f"{d}: {c} bytes" for d, c in zip(ctx.directories, ctx.caps(),
                                                        strict=True))
    notes = [
        f"max_local_disk_size is per LMCache worker in GiB (LMCache multiplies it by 1024**3): "
        f"{size} GiB, so that up to {workers} worker(s) on one directory stay under "
        f"{100 - HEADROOM_PERCENT}% of its hard cap ({caps}); the smallest directory sets it",
        f"assumed: {ctx.ranks} worker(s) in all (tensor_parallel {ctx.tensor_parallel} × "
        f"data_parallel {ctx.data_parallel}), one LocalDiskBackend each; each instance's "
        "ranks on consecutive CUDA devices (vLLM's cuda:<local rank>; SGLang with "
        "--gpu-id-step 1), each instance starting at any device"]
    if len(ctx.directories) > 1:
        notes.append(
            f"PathSharder (by_gpu) gives the worker on CUDA device d the directory "
            f"d % {len(ctx.directories)} of local_disk; directories no device maps to stay "
            "unused, and larger directories are used only up to this size per worker")
    return notes


def odirect(ctx: EngineContext, notes: list[str]) -> bool:
    """O_DIRECT only when every directory's probe passed (notes say why not)."""
    probes = [ctx.probe_for(d) for d in ctx.directories]
    use_odirect = all(p is not None and p.odirect_ok for p in probes)
    for p in probes:
        if p is not None and not p.odirect_ok:
            notes.append(f"fallback: use_odirect false because {odirect_failure(p)}")
    if not use_odirect and all(p is None or p.odirect_ok for p in probes):
        notes.append("use_odirect false: not every directory was probed for O_DIRECT")
    return use_odirect


def render(ctx: EngineContext) -> Rendered:
    """The LMCache YAML for the engine's directories."""
    ctx.check()
    notes = probe_notes(ctx)
    dirs = ctx.directories
    size, workers = disk_size(ctx)
    notes.extend(size_notes(ctx, size, workers))
    data: dict[str, object] = {
        "local_disk": ",".join(f"file://{d}/" for d in dirs),
        "max_local_disk_size": size,
        "extra_config": {"use_odirect": odirect(ctx, notes)},
    }
    if len(dirs) > 1:
        data["local_disk_path_sharding"] = "by_gpu"
        notes.append(
            "several directories: local_disk is a comma-separated list with "
            "local_disk_path_sharding by_gpu, which only recent LMCache releases understand "
            "(PathSharder); older ones take a single directory: use one file per GPU then")
    notes.extend(fixed_notes(ctx))
    return Rendered({CONFIG_NAME: dump_yaml(ctx, data)}, "yaml", tuple(notes))


def fixed_notes(ctx: EngineContext) -> list[str]:
    """Notes on what kvagent leaves to the operator."""
    notes = []
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
    return notes
