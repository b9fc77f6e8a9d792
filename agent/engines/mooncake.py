"""Mooncake store: an env file for its SSD offload (the client's file storage).

Checked against kvcache-ai/Mooncake mooncake-store/src/config/file_storage_config.cpp,
config/bucket_backend_config.cpp and mooncake-wheel/mooncake/mooncake_config.py;
see KEYS.md:
- ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``: must be an existing, absolute, writable
  directory that is not a symlink (kvagent's engine directory is one).
- ``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES``: bytes, per client (rank); the
  default of 2 TB ignores the real disk.
- ``MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE`` (bytes) and
  ``MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY`` (none/fifo/lru): when the bucket
  backend evicts; 0 would mean 90% of the disk. Also written under the older
  names ``MOONCAKE_BUCKET_MAX_TOTAL_SIZE`` / ``MOONCAKE_BUCKET_EVICTION_POLICY``,
  which current Mooncake still reads as fallbacks.
- ``MOONCAKE_OFFLOAD_ENABLED``: read by the Python MooncakeConfig.load_from_env
  (when MOONCAKE_CONFIG_PATH is unset).
"""

from __future__ import annotations

from .base import EngineContext, Rendered, dump_env, indexed_names, odirect_failure, probe_notes

CONFIG_BASE = "mooncake"


def render(ctx: EngineContext) -> Rendered:
    """One env file per directory (one Mooncake client each)."""
    ctx.check()
    notes = probe_notes(ctx)
    names = indexed_names(CONFIG_BASE, ".env", len(ctx.directories))
    files: dict[str, str] = {}
    for name, directory in zip(names, ctx.directories, strict=True):
        per_rank = ctx.cap_of(directory) // ctx.ranks
        files[name] = dump_env(ctx, {
            "MOONCAKE_OFFLOAD_ENABLED": "true",
            "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": directory,
            "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(per_rank),
            "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(per_rank),
            "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY": "lru",
            "MOONCAKE_BUCKET_MAX_TOTAL_SIZE": str(per_rank),
            "MOONCAKE_BUCKET_EVICTION_POLICY": "lru",
        })
        probe = ctx.probe_for(directory)
        if probe is not None and not probe.odirect_ok:
            notes.append(f"{odirect_failure(probe)}; Mooncake's file storage has no O_DIRECT "
                         "setting kvagent could confirm: nothing to switch")
    notes.append(f"sizes are bytes per Mooncake client ({ctx.ranks} rank(s) assumed); the "
                 "bucket backend's eviction threshold is set to the same cap")
    notes.append("the bucket settings are written under both names Mooncake reads: "
                 "MOONCAKE_OFFLOAD_BUCKET_* (current, read first) and the older "
                 "MOONCAKE_BUCKET_* (same values, so either release gets them)")
    notes.append("offload also needs the store processes started with --enable_offload=true "
                 "(command-line flag, not rendered: kvagent does not launch Mooncake)")
    return Rendered(dict(sorted(files.items())), "env", tuple(notes))
