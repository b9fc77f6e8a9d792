"""SGLang HiCache with the ``file`` storage backend: server arguments plus an env file.

Checked against sgl-project/sglang python/sglang/srt/mem_cache/hicache_storage.py
(HiCacheFile), mem_cache/storage/file/lru_file_evictor.py, srt/environ.py and
server_args.py; see KEYS.md:
- arguments ``--enable-hierarchical-cache --hicache-storage-backend file``.
- ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``: the directory (default /tmp/hicache).
- ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE``: LRU cap in bytes per TP rank (a plain
  byte count; only recent SGLang evicts, older releases ignore it).
- The file backend writes through the page cache (no O_DIRECT switch).
"""

from __future__ import annotations

from .base import (
    EngineContext,
    Rendered,
    dump_args,
    dump_env,
    indexed_names,
    odirect_failure,
    probe_notes,
)

ARGS_NAME = "sglang.args"
ENV_BASE = "sglang-hicache"
ARGS = ("--enable-hierarchical-cache", "--hicache-storage-backend", "file")


def render(ctx: EngineContext) -> Rendered:
    """``sglang.args`` plus one env file per directory (one SGLang server each)."""
    ctx.check()
    notes = probe_notes(ctx)
    files: dict[str, str] = {ARGS_NAME: dump_args(ARGS)}
    names = indexed_names(ENV_BASE, ".env", len(ctx.directories))
    for name, directory in zip(names, ctx.directories, strict=True):
        per_rank = ctx.cap_of(directory) // ctx.ranks
        files[name] = dump_env(ctx, {
            "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": directory,
            "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": str(per_rank),
        })
        probe = ctx.probe_for(directory)
        if probe is not None and not probe.odirect_ok:
            notes.append(f"{odirect_failure(probe)}; no fallback needed: SGLang's file backend "
                         "uses buffered I/O")
    notes.append(
        f"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE={per_rank} bytes is per TP rank ({ctx.ranks} "
        "rank(s) assumed); it is honoured only by SGLang releases with the HiCacheFile LRU "
        "evictor: older ones never evict on disk and meet kvagent's cap (the directory's xfs "
        "project quota: ENOSPC) instead; turn on the engine's cleaner (engines[].cleaner) "
        "to have kvagent delete their oldest files")
    if len(ctx.directories) > 1:
        notes.append("one env file per directory, for one SGLang server each; the arguments "
                     "are the same for all")
    return Rendered(dict(sorted(files.items())), "args", tuple(notes))
