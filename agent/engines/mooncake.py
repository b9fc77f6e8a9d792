"""Mooncake store: env files for its SSD offload (each store client's file storage).

Checked against the pinned wheel, mooncake-transfer-engine 0.3.13.post1 (docs/engines.md;
``agent/engines/checks/check_mooncake.py`` runs it on every render):

- ``MOONCAKE_OFFLOAD_ENABLED``: read only by the Python ``mooncake/mooncake_config.py``
  (``MooncakeConfig.load_from_env``, when ``MOONCAKE_CONFIG_PATH`` is unset), which hands
  it to the store's ``setup`` as ``enable_ssd_offload``; ``_parse_bool`` raises on
  anything but true/false/yes/no/on/off/1/0/enable/disable.
- ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``: the client's storage directory (the native
  ``FileStorageConfig::FromEnvironment`` in ``mooncake/store.so``, and ``load_from_env``'s
  ``ssd_offload_path``). ``ValidatePath`` refuses a path that is not absolute, has a
  ``..``, does not exist, is not a writable directory or is a symlink.
- ``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES``: bytes, per client (int64; default 2 TB,
  which ignores the disk; 0 is refused by ``Validate``).
- ``MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE`` (bytes of bucket data and metadata files the
  client keeps before it evicts; unset or 0 means 90% of the filesystem) and
  ``MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY`` (``fifo`` or ``lru``; any other word is
  silently no eviction). ``BucketBackendConfig::FromEnvironment`` also reads the older
  ``MOONCAKE_BUCKET_MAX_TOTAL_SIZE`` / ``MOONCAKE_BUCKET_EVICTION_POLICY`` as fallbacks
  (both strings are in the 0.3.13.post1 ``store.so``): written with the same values so a
  release that reads only those gets them too.

Each client owns its directory: the bucket backend names files ``<id>.bucket`` /
``<id>.meta`` (ids from a millisecond clock), loads every bucket it finds there at start,
deletes ``.bucket`` files without ``.meta`` as orphans and evicts by its own total: two
clients in one directory would delete and evict each other's data. So with more than one
rank per directory each rank gets its own subdirectory (``<dir>/rank<r>``, made by apply)
and its own env file, sized ``engine_bytes(cap, ranks)``.
"""

from __future__ import annotations

import os

from .base import (
    EngineContext,
    Rendered,
    dump_env,
    engine_bytes,
    odirect_failure,
    probe_notes,
    refuse_tier_off,
)

CONFIG_BASE = "mooncake"
#: What the bucket backend evicts first when it reaches its size (fifo or lru).
EVICTION_POLICY = "lru"


def client_name(index: int | None, rank: int | None) -> str:
    """The env file of one client: ``mooncake[-<dir index>][-rank<r>].env``."""
    parts = [CONFIG_BASE]
    if index is not None:
        parts.append(str(index))
    if rank is not None:
        parts.append(f"rank{rank}")
    return "-".join(parts) + ".env"


def clients(ctx: EngineContext) -> list[tuple[str, str, str]]:
    """(file name, engine directory, storage path) of every Mooncake client: one per rank
    per directory; a rank's own subdirectory when several ranks share the directory."""
    several = len(ctx.directories) > 1
    out = []
    for i, directory in enumerate(ctx.directories):
        index = i if several else None
        if ctx.ranks == 1:
            out.append((client_name(index, None), directory, directory))
            continue
        for r in range(ctx.ranks):
            out.append((client_name(index, r), directory, os.path.join(directory, f"rank{r}")))
    return out


def client_env(ctx: EngineContext, path: str, size: int) -> str:
    """One client's env file."""
    return dump_env(ctx, {
        "MOONCAKE_OFFLOAD_ENABLED": "true",
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": path,
        "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(size),
        "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(size),
        "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY": EVICTION_POLICY,
        "MOONCAKE_BUCKET_MAX_TOTAL_SIZE": str(size),
        "MOONCAKE_BUCKET_EVICTION_POLICY": EVICTION_POLICY,
    })


def render(ctx: EngineContext) -> Rendered:
    """One env file per Mooncake client (per rank, per directory).

    :class:`~agent.engines.base.TierOff` when a directory's share per client is 0 bytes
    (Mooncake refuses a total of 0 and reads a bucket size of 0 as 90% of the disk)."""
    ctx.check()
    refuse_tier_off(ctx, "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", [
        f"{d} (quota {cap} bytes) gives each of its {ctx.ranks} client(s) 0 bytes"
        for d, cap in zip(ctx.directories, ctx.caps(), strict=True)
        if engine_bytes(cap, ctx.ranks) <= 0])
    notes = probe_notes(ctx)
    files: dict[str, str] = {}
    subdirectories: list[str] = []
    for name, directory, path in clients(ctx):
        files[name] = client_env(ctx, path, engine_bytes(ctx.cap_of(directory), ctx.ranks))
        if path != directory:
            subdirectories.append(path)
    for directory in ctx.directories:
        probe = ctx.probe_for(directory)
        if probe is not None and not probe.odirect_ok:
            notes.append(f"{odirect_failure(probe)}; Mooncake's file storage has no "
                         "O_DIRECT setting kvagent could confirm: nothing to switch")
    notes.extend(_notes(ctx))
    return Rendered(dict(sorted(files.items())), "env", tuple(notes), tuple(subdirectories))


def _notes(ctx: EngineContext) -> list[str]:
    notes = [f"sizes are bytes per Mooncake client: each directory's quota less "
             f"headroom, split among its {ctx.ranks} rank(s) (tensor_parallel "
             f"{ctx.tensor_parallel} x data_parallel {ctx.data_parallel}); the bucket "
             "backend's eviction threshold (MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE, lru) is "
             "the same size"]
    if ctx.ranks > 1:
        notes.append("one env file per rank (mooncake[-<dir>]-rank<r>.env, r = instance x "
                     "tensor_parallel + TP rank), each with its own subdirectory <dir>/rank<r> "
                     "that apply creates: Mooncake clients sharing one directory delete and "
                     "evict each other's bucket files. Start each rank's process with its own "
                     "file (MOONCAKE_OFFLOAD_FILE_STORAGE_PATH is read from the process "
                     "environment)")
    notes.append("the bucket settings are also written under the older names "
                 "MOONCAKE_BUCKET_MAX_TOTAL_SIZE / MOONCAKE_BUCKET_EVICTION_POLICY, which "
                 "Mooncake reads as fallbacks (same values)")
    notes.append("MOONCAKE_OFFLOAD_ENABLED is read by Mooncake's Python MooncakeConfig."
                 "load_from_env, which also needs MOONCAKE_MASTER (the operator's); offload "
                 "also needs the master started with --enable_offload=true (command-line "
                 "flag, not rendered: kvagent does not launch Mooncake)")
    return notes
