"""vLLM's ``--kv-transfer-config``: a bounded disk tier by default, or a CPU tier with an fs tier.

Checked against the code of vLLM 0.33.0 (the contract test, contract/test_vllm.py, holds
renders to it: ``checks/check_vllm.py`` runs vLLM's own config code); see docs/engines.md.
Which connector follows from the operator's choice of a CPU tier (``engines[].cpu_cache``):

Without ``cpu_cache``: ``SimpleCPUOffloadConnector`` with its disk backend
(distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py,
v1/simple_kv_offload/worker.py, manager.py, disk_backend.py):

- ``kv_connector_extra_config.kv_offload_backend: disk`` (``cpu`` or ``disk``; anything
  else raises), ``disk_path`` (required: each worker opens ``<disk_path>.rank_<CUDA
  device index>``, unlinked and created ``O_EXCL | O_NOFOLLOW`` at start, unlinked at
  shutdown) and ``disk_capacity_bytes`` (required above 0; default 100 GiB, whatever the
  disk). The capacity is per worker: each worker sizes its slots as
  ``disk_capacity_bytes // its bytes per block`` (the minimum over the workers, at least
  one block) and ``ftruncate``\\ s its file to slots × bytes per block; the scheduler's
  BlockPool evicts least recently used blocks when the slots are full. So the tier is
  bounded and evicts by itself: ``engine_bytes(cap, tp × dp)`` keeps every worker of
  every replica within the directory's quota.
- ``use_page_cache: true`` only where the O_DIRECT probe failed (O_DIRECT is vLLM's
  default there).
- Replicas on one host (``data_parallel`` > 1) number their files by CUDA device index,
  which restarts at 0 under each replica's ``CUDA_VISIBLE_DEVICES``: each replica gets
  its own file and ``disk_path``.

With ``cpu_cache``: ``OffloadingConnector``, ``spec_name: TieringOffloadingSpec``
(v1/kv_offload/factory.py, tiering/spec.py) with ``cpu_bytes_to_use`` (host RAM for one
engine, all of its workers together; CPUOffloadingSpec raises without it) and
``secondary_tiers: [{type: fs, root_dir: <dir>}]`` (tiering/fs/manager.py). The fs tier
keeps its block files (instances share them, by hash, across restarts) but has no size
setting and evicts nothing on disk: at the quota vLLM's back-pressure drops every store.
kvagent's cleaner bounds it, on by default for it (``engines[].cleaner``).
"""

from __future__ import annotations

from .base import (
    EngineContext,
    Rendered,
    dump_json,
    engine_bytes,
    indexed_names,
    odirect_failure,
    probe_notes,
    refuse_tier_off,
)

CONFIG_BASE = "vllm-kv-transfer-config"
#: The disk backend's file name in the directory (vLLM appends ``.rank_<device>``).
DISK_FILE = "kv-offload"


def render(ctx: EngineContext) -> Rendered:
    """``--kv-transfer-config`` JSON files: per directory and replica for the disk backend
    (no ``cpu_cache``), per directory for the fs tier (``cpu_cache``)."""
    ctx.check()
    if ctx.cpu_bytes is None:
        return _render_disk(ctx)
    return _render_fs(ctx, ctx.cpu_bytes)


# ------------------------------------------------------------------ disk backend
def disk_instances(ctx: EngineContext) -> list[tuple[str, str, str]]:
    """(file name, engine directory, ``disk_path``) per vLLM instance: one per directory,
    or per directory and replica when several replicas share it."""
    several = len(ctx.directories) > 1
    out = []
    for i, directory in enumerate(ctx.directories):
        prefix = f"{CONFIG_BASE}-{i}" if several else CONFIG_BASE
        if ctx.data_parallel == 1:
            out.append((f"{prefix}.json", directory, f"{directory}/{DISK_FILE}"))
            continue
        out.extend((f"{prefix}-replica{r}.json", directory, f"{directory}/{DISK_FILE}-replica{r}")
                   for r in range(ctx.data_parallel))
    return out


def worker_bytes(ctx: EngineContext) -> dict[str, int]:
    """``disk_capacity_bytes`` for each directory: its quota less headroom, split among
    the ``tensor_parallel × data_parallel`` workers that keep a file there.

    :class:`~agent.engines.base.TierOff` when a directory's share is 0 bytes (vLLM
    refuses ``kv_offload_backend: disk`` without a capacity above 0)."""
    sizes = {d: engine_bytes(cap, ctx.ranks)
             for d, cap in zip(ctx.directories, ctx.caps(), strict=True)}
    refuse_tier_off(ctx, "disk_capacity_bytes", [
        f"{d} (quota {cap} bytes) gives each of its {ctx.ranks} worker(s) 0 bytes"
        for d, cap in zip(ctx.directories, ctx.caps(), strict=True) if sizes[d] <= 0])
    return sizes


def disk_config(disk_path: str, capacity: int, page_cache: bool) -> dict[str, object]:
    """The ``--kv-transfer-config`` of one vLLM instance using the disk backend."""
    extra: dict[str, object] = {"kv_offload_backend": "disk", "disk_path": disk_path,
                                "disk_capacity_bytes": capacity}
    if page_cache:
        extra["use_page_cache"] = True
    return {"kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": extra}


def _render_disk(ctx: EngineContext) -> Rendered:
    sizes = worker_bytes(ctx)
    notes = probe_notes(ctx)
    files: dict[str, str] = {}
    for name, directory, disk_path in disk_instances(ctx):
        probe = ctx.probe_for(directory)
        page_cache = probe is not None and not probe.odirect_ok
        files[name] = dump_json(disk_config(disk_path, sizes[directory], page_cache))
        if page_cache and probe is not None:
            notes.append(f"fallback in {name}: use_page_cache true because "
                         f"{odirect_failure(probe)}")
    notes.extend(_disk_notes(ctx, sizes))
    return Rendered(dict(sorted(files.items())), "json", tuple(notes))


def _disk_notes(ctx: EngineContext, sizes: dict[str, int]) -> list[str]:
    notes = [
        "no engines[].cpu_cache: vLLM's SimpleCPUOffloadConnector with its disk backend "
        "(no CPU tier): blocks go between GPU and the pool through pinned staging buffers",
        "disk_capacity_bytes is bytes per worker (" + ", ".join(
            f"{d}: {sizes[d]} of a {c}-byte quota" for d, c in zip(
                ctx.directories, ctx.caps(), strict=True))
        + f"): the quota less headroom, split among {ctx.ranks} worker(s) (tensor_parallel "
        f"{ctx.tensor_parallel} x data_parallel {ctx.data_parallel}); each worker keeps one "
        "file <disk_path>.rank_<CUDA device index> of at most that size (sparse, filled "
        "slot by slot) and vLLM evicts least recently used blocks in it: the tier never "
        "meets the quota",
        "the disk tier lasts as long as the process: vLLM unlinks its files at start and at "
        "shutdown, and instances do not share them; give the engine a cpu_cache for the "
        "OffloadingConnector's fs tier instead, whose files persist and are shared",
        "vLLM turns the connector off when prefix caching is (--no-enable-prefix-caching); "
        "with O_DIRECT (the default) it needs each block's bytes to be a multiple of 4096",
    ]
    if ctx.data_parallel > 1:
        notes.append(
            "one file per replica (vllm-kv-transfer-config[-<i>]-replica<r>.json, disk_path "
            f"<dir>/{DISK_FILE}-replica<r>): each worker names its file by its CUDA device "
            "index, which restarts at 0 under each replica's CUDA_VISIBLE_DEVICES, and vLLM "
            "unlinks the name at start. Start each replica with its own file; one vllm serve "
            "with --data-parallel-size gives every DP rank the same file names")
    if len(ctx.directories) > 1:
        notes.append("one file per directory, for one vLLM instance each")
    notes.append("written for vLLM 0.33.0 (SimpleCPUOffloadConnector, kv_offload_backend "
                 "disk); pass the file's content as --kv-transfer-config")
    return notes


# ------------------------------------------------------------------ fs tier
def transfer_config(directory: str, cpu_bytes: int) -> dict[str, object]:
    """The ``--kv-transfer-config`` of the vLLM instance whose fs tier is ``directory``."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": cpu_bytes,
            "spec_name": "TieringOffloadingSpec",
            "secondary_tiers": [{"type": "fs", "root_dir": directory}],
        },
    }


def _render_fs(ctx: EngineContext, cpu_bytes: int) -> Rendered:
    """One kv-transfer-config JSON per directory (one vLLM instance each)."""
    notes = probe_notes(ctx)
    names = indexed_names(CONFIG_BASE, ".json", len(ctx.directories))
    files: dict[str, str] = {}
    for name, directory in zip(names, ctx.directories, strict=True):
        files[name] = dump_json(transfer_config(directory, cpu_bytes))
        probe = ctx.probe_for(directory)
        if probe is not None and not probe.odirect_ok:
            notes.append(f"{odirect_failure(probe)}; vLLM's fs tier has no O_DIRECT setting: it "
                         "probes O_DIRECT itself and falls back to buffered I/O (page cache)")
    notes.extend(_fs_notes(ctx, cpu_bytes))
    return Rendered(dict(sorted(files.items())), "json", tuple(notes))


def _fs_notes(ctx: EngineContext, cpu_bytes: int) -> list[str]:
    """What the operator should know about an fs-tier render (true for vLLM 0.33.0)."""
    notes = [f"cpu_bytes_to_use = {cpu_bytes} bytes (engines[].cpu_cache) is host RAM for one "
             "vLLM engine, all of its tensor/pipeline-parallel workers together"]
    if ctx.data_parallel > 1:
        notes.append(f"data_parallel = {ctx.data_parallel}: each data-parallel engine pins its "
                     f"own CPU tier, {ctx.data_parallel * cpu_bytes} bytes of host RAM in all")
    if len(ctx.directories) > 1:
        notes.append("the fs tier takes one root_dir: one file per directory, for one vLLM "
                     "instance each (secondary tiers in one list are a hierarchy, not shards)")
    bound = ("kvagent's cleaner (engines[].cleaner, on by default for it) deletes its oldest "
             "block files on each full pass once they pass the high watermark of a "
             "directory's cap; between passes the cap is the bound"
             if ctx.cleaner else
             "the cleaner is off (engines[].cleaner.enabled: false, or a pool mounted "
             "noquota): once a directory is full "
             "vLLM stores nothing more there (its back-pressure drops every store after "
             "ENOSPC) until something deletes files")
    notes.append(
        f"vLLM's fs tier has no size setting and does not evict on disk: kvagent's cap of "
        f"{min(ctx.caps())} to {max(ctx.caps())} bytes per directory is a hard limit (the "
        "directory's xfs project quota, on pools mounted with prjquota, the default), where "
        f"vLLM gets ENOSPC; {bound}")
    notes.append("vLLM makes its own directories under root_dir: <model>_<hash>/config.json and "
                 "<model>_<hash>_r<rank>/<hhh>/<hh>_g<group>/<block hash>.bin, written by the "
                 "engine's scheduler (one file holds a block of all its workers); instances "
                 "with the same model and layout share blocks there, by block hash")
    notes.append("written for vLLM 0.33.0 (TieringOffloadingSpec, fs tier); pass the file's "
                 "content as --kv-transfer-config")
    return notes
