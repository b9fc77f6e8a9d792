"""vLLM's native OffloadingConnector with a file-system secondary tier (``--kv-transfer-config``).

Checked against vllm-project/vllm docs/features/kv_offloading_usage.md (vLLM
0.22 and later have ``TieringOffloadingSpec`` with ``type: fs`` tiers) and
vllm/v1/kv_offload/tiering/fs/io.py; see KEYS.md:
- ``kv_connector: OffloadingConnector``, ``kv_role: kv_both``,
  ``kv_connector_extra_config.spec_name: TieringOffloadingSpec``,
  ``secondary_tiers: [{type: fs, root_dir: <dir>}]``.
- ``cpu_bytes_to_use`` (required, host RAM for the CPU primary tier, total across
  workers) is written only when the caller gives it.
- The fs tier has no documented size cap and no O_DIRECT switch (it probes
  O_DIRECT itself and falls back to buffered I/O).
"""

from __future__ import annotations

from .base import EngineContext, Rendered, dump_json, indexed_names, odirect_failure, probe_notes

CONFIG_BASE = "vllm-kv-transfer-config"


def render(ctx: EngineContext) -> Rendered:
    """One kv-transfer-config JSON per directory (one vLLM instance each)."""
    ctx.check()
    notes = probe_notes(ctx)
    names = indexed_names(CONFIG_BASE, ".json", len(ctx.directories))
    files: dict[str, str] = {}
    for name, directory in zip(names, ctx.directories, strict=True):
        extra: dict[str, object] = {
            "spec_name": "TieringOffloadingSpec",
            "secondary_tiers": [{"type": "fs", "root_dir": directory}],
        }
        if ctx.cpu_bytes is not None:
            extra["cpu_bytes_to_use"] = ctx.cpu_bytes
        config = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
        files[name] = dump_json(config)
        probe = ctx.probe_for(directory)
        if probe is not None and not probe.odirect_ok:
            notes.append(f"{odirect_failure(probe)}; vLLM's fs tier has no O_DIRECT setting: it "
                         "probes O_DIRECT itself and falls back to buffered I/O (page cache)")
    if ctx.cpu_bytes is None:
        notes.append("cpu_bytes_to_use is required by vLLM (host RAM for the CPU tier, total "
                     "across workers) and kvagent does not size host RAM: add it before use")
    if len(ctx.directories) > 1:
        notes.append("the fs tier takes one root_dir: one file per directory, for one vLLM "
                     "instance each (secondary tiers in one list are a hierarchy, not shards)")
    notes.append(
        f"vLLM's fs tier has no documented size cap and does not evict on disk: kvagent's cap "
        f"of {min(ctx.caps())} to {max(ctx.caps())} bytes per directory is a hard limit (the directory's "
        "xfs project quota, on pools mounted with prjquota, the default): vLLM gets ENOSPC "
        "there and stores nothing more; kvagent deletes nothing unless the engine's cleaner "
        "is turned on (engines[].cleaner: oldest files first)")
    notes.append("needs vLLM 0.22 or later (TieringOffloadingSpec); pass the file's content as "
                 "--kv-transfer-config")
    return Rendered(dict(sorted(files.items())), "json", tuple(notes))
