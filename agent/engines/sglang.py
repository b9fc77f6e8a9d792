"""SGLang HiCache on the pool: server arguments plus env files, ``file`` or ``mooncake`` backend.

Checked against the pinned wheel, sglang 0.5.23 (docs/engines.md; ``checks/check_sglang.py`` runs
SGLang's own code on every render):

File backend (``ctx.backend`` None or ``file``; ``mem_cache/hicache_storage.py`` HiCacheFile,
``mem_cache/storage/file/lru_file_evictor.py``, ``srt/environ.py``):

- ``--enable-hierarchical-cache --hicache-storage-backend file``.
- ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``: the directory itself. Every rank writes
  into it, flat: files are ``<key>_<model>_<tp rank>_<tp size>.bin`` (no per-rank
  subdirectory), and TP rank 0 creates the directory when it is missing.
- ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE``: plain bytes (``_parse_size_to_bytes``; a
  suffix would be read by ``human_readable_int``, where ``G`` is 10^9). Each TP rank builds
  its own ``LRUFileEvictor`` over the files it owns, so the value is per rank:
  ``engine_bytes(cap, ranks)`` keeps all ranks of all replicas under the directory's quota.
- The file backend writes through the page cache (no O_DIRECT switch).

Mooncake backend (``ctx.backend == "mooncake"``; ``mem_cache/storage/mooncake_store/
mooncake_store.py`` MooncakeStoreConfig.load_from_env and MooncakeStore.__init__; the
native names from mooncake-transfer-engine 0.3.13.post1's ``mooncake/store.so``):

- ``--enable-hierarchical-cache --hicache-storage-backend mooncake``.
- ``MOONCAKE_ENABLE_SSD_OFFLOAD=true``: SGLang's switch (``Envs``), handed to the store's
  ``setup(enable_ssd_offload=True)``.
- ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``: the base path. SGLang reads it
  (``ssd_offload_path``), appends ``rank_<dp>_<tp>_<pp>_<cp>`` and hands that to
  ``setup(ssd_offload_path=...)``, which overrides the variable in Mooncake: each rank's
  client owns its own subdirectory. kvagent makes them (dp 0, pp 0, cp 0, one per TP rank).
- ``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`` and ``MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE``
  (bytes, int64, per client: read by the native store in every rank process) =
  ``engine_bytes(cap, ranks)``; ``MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY=lru``.
- SGLang's storage ``dp_rank`` is 0 unless attention DP is on, so replicas on one host
  (``data_parallel`` > 1) would share ``rank_0_<tp>_0_0``: each replica gets its own base
  path ``<dir>/replica<r>`` and env file.
"""

from __future__ import annotations

import os

from .base import (
    EngineContext,
    Rendered,
    dump_args,
    dump_env,
    engine_bytes,
    indexed_names,
    odirect_failure,
    probe_notes,
    refuse_tier_off,
)

ARGS_NAME = "sglang.args"
ENV_BASE = "sglang-hicache"
MOONCAKE_ENV_BASE = "sglang-mooncake"
HICACHE = ("--enable-hierarchical-cache", "--hicache-storage-backend")
ARGS = (*HICACHE, "file")
MOONCAKE_ARGS = (*HICACHE, "mooncake")
#: What Mooncake's bucket backend evicts first when it reaches its size (fifo or lru).
EVICTION_POLICY = "lru"


def render(ctx: EngineContext) -> Rendered:
    """``sglang.args`` plus env files for the configured storage backend.

    :class:`~agent.engines.base.TierOff` when a directory's share per rank is 0 bytes
    (the file backend's evictor reads 0 as no cap; Mooncake as no limit)."""
    ctx.check()
    mooncake = ctx.backend == "mooncake"
    refuse_tier_off(ctx, "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES" if mooncake else
                    "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE", rank_shares_of_zero(ctx))
    if mooncake:
        return _render_mooncake(ctx)
    return _render_file(ctx)


def rank_shares_of_zero(ctx: EngineContext) -> list[str]:
    """A line for each directory whose quota, split among ``ctx.ranks``, is 0 bytes."""
    return [f"{d} (quota {cap} bytes) gives each of its {ctx.ranks} rank(s) 0 bytes, which "
            "the engine reads as no size at all"
            for d, cap in zip(ctx.directories, ctx.caps(), strict=True)
            if engine_bytes(cap, ctx.ranks) <= 0]


# ------------------------------------------------------------------ file backend
def _render_file(ctx: EngineContext) -> Rendered:
    """One env file per directory (one SGLang server each), sized per TP rank."""
    notes = probe_notes(ctx)
    files: dict[str, str] = {ARGS_NAME: dump_args(ARGS)}
    names = indexed_names(ENV_BASE, ".env", len(ctx.directories))
    for name, directory in zip(names, ctx.directories, strict=True):
        files[name] = dump_env(ctx, {
            "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": directory,
            "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": str(engine_bytes(ctx.cap_of(directory),
                                                                     ctx.ranks)),
        })
    notes.extend(_odirect_notes(ctx, "no fallback needed: SGLang's file backend uses "
                                     "buffered I/O"))
    notes.append(
        f"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE is bytes per TP rank: each rank's "
        f"LRUFileEvictor caps the files it owns at it; it is the directory's xfs project quota "
        f"less headroom, split among {ctx.ranks} rank(s) (tensor_parallel "
        f"{ctx.tensor_parallel} x data_parallel {ctx.data_parallel}). SGLang releases without "
        "the HiCacheFile LRU evictor never evict on disk and meet the quota (ENOSPC) instead; "
        "turn on the engine's cleaner (engines[].cleaner) to have kvagent delete their "
        "oldest files")
    if len(ctx.directories) > 1:
        notes.append("one env file per directory, for one SGLang server each; the arguments "
                     "are the same for all")
    return Rendered(dict(sorted(files.items())), "args", tuple(notes))


# ------------------------------------------------------------------ mooncake backend
def rank_subdirectory(tp_rank: int, dp_rank: int = 0) -> str:
    """The subdirectory SGLang's MooncakeStore gives one rank (pp 0, cp 0)."""
    return f"rank_{dp_rank}_{tp_rank}_0_0"


def mooncake_bases(ctx: EngineContext) -> list[tuple[str, str, str]]:
    """(env file name, engine directory, base path) per SGLang server: one per directory,
    or per directory and replica when several replicas share it."""
    several = len(ctx.directories) > 1
    out = []
    for i, directory in enumerate(ctx.directories):
        prefix = f"{MOONCAKE_ENV_BASE}-{i}" if several else MOONCAKE_ENV_BASE
        if ctx.data_parallel == 1:
            out.append((f"{prefix}.env", directory, directory))
            continue
        for r in range(ctx.data_parallel):
            out.append((f"{prefix}-replica{r}.env", directory,
                        os.path.join(directory, f"replica{r}")))
    return out


def _render_mooncake(ctx: EngineContext) -> Rendered:
    """One env file per server (directory, replica); one subdirectory per rank."""
    notes = probe_notes(ctx)
    files: dict[str, str] = {ARGS_NAME: dump_args(MOONCAKE_ARGS)}
    subdirectories: list[str] = []
    for name, directory, base in mooncake_bases(ctx):
        size = str(engine_bytes(ctx.cap_of(directory), ctx.ranks))
        files[name] = dump_env(ctx, {
            "MOONCAKE_ENABLE_SSD_OFFLOAD": "true",
            "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": base,
            "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": size,
            "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": size,
            "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY": EVICTION_POLICY,
        })
        if base != directory:
            subdirectories.append(base)
        subdirectories.extend(os.path.join(base, rank_subdirectory(t))
                              for t in range(ctx.tensor_parallel))
    notes.extend(_odirect_notes(ctx, "Mooncake's file storage has no O_DIRECT setting "
                                     "kvagent could confirm: nothing to switch"))
    notes.extend(_mooncake_notes(ctx))
    return Rendered(dict(sorted(files.items())), "args", tuple(notes),
                    tuple(sorted(subdirectories)))


def _mooncake_notes(ctx: EngineContext) -> list[str]:
    notes = [
        f"Mooncake's sizes are bytes per rank (each SGLang rank embeds its own Mooncake "
        f"client): the directory's quota less headroom, split among {ctx.ranks} rank(s) "
        f"(tensor_parallel {ctx.tensor_parallel} x data_parallel {ctx.data_parallel}); the "
        "bucket backend's eviction threshold (lru) is the same size",
        "SGLang appends rank_<dp>_<tp>_<pp>_<cp> to MOONCAKE_OFFLOAD_FILE_STORAGE_PATH for "
        "each rank's client; kvagent makes rank_0_<tp>_0_0 for each TP rank (SGLang would "
        "also make them itself). Pipeline or context parallelism (pp/cp > 1) adds ranks "
        "kvagent does not count: size tensor_parallel to cover them",
        "kvagent renders only the SSD offload: MOONCAKE_MASTER (or MOONCAKE_CLIENT), "
        "MOONCAKE_PROTOCOL, MOONCAKE_DEVICE, MOONCAKE_GLOBAL_SEGMENT_SIZE and the metadata "
        "server are the operator's, in the same environment; the master must run with "
        "--enable_offload=true",
        "SGLang reads MOONCAKE_ENABLE_SSD_OFFLOAD and MOONCAKE_OFFLOAD_FILE_STORAGE_PATH only "
        "when it configures Mooncake from the environment: with "
        "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH or --hicache-storage-backend-extra-config "
        "naming a master it ignores both: put enable_ssd_offload and ssd_offload_path there",
    ]
    if ctx.data_parallel > 1:
        notes.append(
            "one env file per replica (sglang-mooncake[-<i>]-replica<r>.env, base "
            "<dir>/replica<r>): SGLang "
            "numbers a rank's subdirectory by its data-parallel rank only under attention "
            "DP, so replicas sharing one base would share each rank's Mooncake directory, "
            "whose bucket files they would truncate and evict. Start each replica with its "
            "own file; one server with --dp-size but no attention DP cannot be separated")
    if len(ctx.directories) > 1:
        notes.append("one env file per directory, for one SGLang server each; the arguments "
                     "are the same for all")
    return notes


def _odirect_notes(ctx: EngineContext, consequence: str) -> list[str]:
    """A note per directory whose O_DIRECT probe failed."""
    notes = []
    for directory in ctx.directories:
        probe = ctx.probe_for(directory)
        if probe is not None and not probe.odirect_ok:
            notes.append(f"{odirect_failure(probe)}; {consequence}")
    return notes
