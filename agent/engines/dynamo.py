"""NVIDIA Dynamo KVBM: an environment file for its disk tier (G3).

Checked against the pinned wheel kvbm 1.6.1 (its Rust core ``kvbm/_core.abi3.so``
holds every name below; ``agent/engines/checks/check_dynamo.py`` judges each render)
and ai-dynamo/dynamo lib/llm/src/block_manager/storage/disk.rs,
lib/llm/src/block_manager/distributed/leader.rs and
lib/bindings/kvbm/src/block_manager/distributed/leader.rs; see docs/engines.md:
- ``DYN_KVBM_DISK_CACHE_DIR``: where each KVBM worker creates its cache file
  (``mkostemp`` of ``dynamo-kvbm-disk-cache-XXXXXX``; default /tmp/).
- ``DYN_KVBM_DISK_CACHE_GB``: decimal GB (the leader's ``compute_num_blocks`` multiplies
  by 1_000_000_000 and divides by the bytes per block summed over its tensor-parallel
  workers; each worker then preallocates its share in its own file in the same
  directory): the size of one instance, all its TP workers together. Parsed with
  ``parse::<f64>()`` (older KVBM: an integer) and anything unparsable is 0, the disk
  tier off: kvagent writes a whole number. Each env file is for the instances that use
  its directory, so each is sized from that directory's own quota; ``data_parallel``
  instances sharing the directory split it. A size below 1 GB (0: the tier off) is
  refused (:class:`~agent.engines.base.TierOff`), never rendered.
- ``DYN_KVBM_DISK_DISABLE_O_DIRECT`` / ``DYN_KVBM_DISK_ZEROFILL_FALLBACK``: KVBM
  only checks that they are *set* (``std::env::var(..).is_ok()``: any value, even
  "false", switches them on), so kvagent writes them only when a probe failed.

GPUDirect Storage: with the disk tier sized and no CPU tier (``DYN_KVBM_CPU_CACHE_GB``
unset, what kvagent renders), KVBM bypasses host memory and moves blocks between GPU
and disk directly (``should_bypass_cpu_cache`` in lib/llm/src/block_manager/config.rs;
KVBM v2 forces NIXL's GDS_MT backend then), and its disk-to-GPU onboarding is a NIXL
read into device memory in any layout (``WriteToStrategy<DeviceStorage> for
DiskStorage``). Without nvidia-fs and cuFile that hangs or, worse, serves wrong KV
(ai-dynamo/dynamo#6032, #15079). A CPU tier would not remove that dependency, and
kvagent does not size host RAM: so it refuses (:class:`GdsNotReady`) instead of
rendering a fallback, unless the context says GDS is ready or was not looked at.
"""

from __future__ import annotations

import errno

from ..errors import KvagentError
from ..system.gds import INSTALL_HINT
from .base import (
    GB,
    EngineContext,
    Rendered,
    dump_env,
    engine_bytes,
    fallocate_failure,
    indexed_names,
    odirect_failure,
    probe_notes,
    refuse_tier_off,
)

CONFIG_BASE = "dynamo-kvbm"


class GdsNotReady(KvagentError):
    """Dynamo's disk-only KVBM needs GPUDirect Storage, which this host lacks."""


def instance_gb(ctx: EngineContext) -> dict[str, int]:
    """``DYN_KVBM_DISK_CACHE_GB`` for each directory: its own quota less headroom, split
    among the ``data_parallel`` instances that use it, in whole decimal GB.

    :class:`~agent.engines.base.TierOff` when a directory's share is below 1 GB: KVBM
    reads 0 as its disk tier off."""
    sizes = {d: engine_bytes(cap, ctx.data_parallel) // GB
             for d, cap in zip(ctx.directories, ctx.caps(), strict=True)}
    refuse_tier_off(ctx, "DYN_KVBM_DISK_CACHE_GB", [
        f"{d} (quota {cap} bytes) gives each of its {ctx.data_parallel} KVBM instance(s) "
        f"{engine_bytes(cap, ctx.data_parallel)} bytes, below 1 GB (0: KVBM's disk tier off)"
        for d, cap in zip(ctx.directories, ctx.caps(), strict=True) if sizes[d] == 0])
    return sizes


def render(ctx: EngineContext) -> Rendered:
    """One env file per directory (for the KVBM instances that use it, with their TP workers),
    each sized from its own directory's quota.

    :class:`GdsNotReady` when ``ctx.gds`` shows GPUDirect Storage missing;
    :class:`~agent.engines.base.TierOff` when a directory is too small for its instances.
    """
    ctx.check()
    if ctx.gds is not None and not ctx.gds.ready:
        raise GdsNotReady(
            f"pool {ctx.pool!r}: not rendering Dynamo KVBM's disk tier: it moves KV blocks "
            "between disk and GPU with GPUDirect Storage (no CPU tier), and without it KVBM "
            "hangs or serves wrong KV (ai-dynamo/dynamo#6032, #15079); missing: "
            + "; ".join(ctx.gds.missing),
            INSTALL_HINT + "; or set gds: trust on the engine if its image brings cuFile and "
            "you checked GDS yourself; or remove dynamo from the pool's engines")
    notes = probe_notes(ctx)
    if ctx.gds is None:
        notes.append("GPUDirect Storage was not checked (gds: trust): disk-only KVBM needs "
                     "nvidia-fs and cuFile (gdscheck -p shows them)")
    else:
        notes.append(ctx.gds.describe())
    sizes = instance_gb(ctx)
    names = indexed_names(CONFIG_BASE, ".env", len(ctx.directories))
    files: dict[str, str] = {}
    for name, directory in zip(names, ctx.directories, strict=True):
        env = {"DYN_KVBM_DISK_CACHE_DIR": directory,
               "DYN_KVBM_DISK_CACHE_GB": str(sizes[directory])}
        probe = ctx.probe_for(directory)
        if probe is not None and not probe.odirect_ok:
            env["DYN_KVBM_DISK_DISABLE_O_DIRECT"] = "true"
            notes.append(f"fallback in {name}: DYN_KVBM_DISK_DISABLE_O_DIRECT because "
                         f"{odirect_failure(probe)}")
        if probe is not None and not probe.fallocate_ok:
            failure = probe.fallocate.failure
            if failure is not None and failure.errno == errno.EOPNOTSUPP:
                env["DYN_KVBM_DISK_ZEROFILL_FALLBACK"] = "true"
                notes.append(f"fallback in {name}: DYN_KVBM_DISK_ZEROFILL_FALLBACK because "
                             f"{fallocate_failure(probe)}")
            else:
                notes.append(
                    f"{fallocate_failure(probe)}: KVBM zero-fills only when fallocate reports "
                    "EOPNOTSUPP, so no setting helps here; its preallocated cache file may be "
                    "sparse and hit ENOSPC later")
        files[name] = dump_env(ctx, env)
    notes.append("DYN_KVBM_DISK_CACHE_GB is decimal GB (10^9 bytes) per KVBM instance, all "
                 f"its {ctx.tensor_parallel} tensor-parallel worker(s) together (each "
                 "preallocates its share in its own file), rounded down: each file's "
                 "directory's own quota less headroom, split among "
                 f"{ctx.data_parallel} instance(s) per directory ("
                 + ", ".join(f"{d}: {sizes[d]} GB of a {c}-byte quota"
                             for d, c in zip(ctx.directories, ctx.caps(), strict=True))
                 + "); KVBM preallocates all of it at start")
    notes.append("DYN_KVBM_CPU_CACHE_GB (host RAM) is not rendered: older KVBM requires it; "
                 "with only the disk tier set, recent KVBM offloads GPU to disk directly "
                 "through GPUDirect Storage")
    notes.append("KVBM unlinks its cache file after registering it: du shows nothing; "
                 "statvfs (free space) and the directory's project quota (kvagent status) "
                 "do")
    return Rendered(dict(sorted(files.items())), "env", tuple(notes))
