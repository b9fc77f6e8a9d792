"""vLLM's native OffloadingConnector with a file-system secondary tier (``--kv-transfer-config``).

Checked against the code of vLLM 0.33.0 (the contract test, contract/test_vllm.py, holds
renders to it); see KEYS.md:
- ``kv_connector: OffloadingConnector``, ``kv_role: kv_both`` (vllm/config/kv_transfer.py;
  the connector is registered in distributed/kv_transfer/kv_connector/factory.py).
- ``kv_connector_extra_config.spec_name: TieringOffloadingSpec`` (v1/kv_offload/factory.py)
  with ``secondary_tiers: [{type: fs, root_dir: <dir>}]`` (v1/kv_offload/tiering/spec.py,
  tiering/factory.py, tiering/fs/manager.py: FileSystemTierManager).
- ``cpu_bytes_to_use`` is required: CPUOffloadingSpec raises "cpu_bytes_to_use must be
  specified" without it (v1/kv_offload/cpu/spec.py). It is host RAM for one vLLM engine,
  all of its workers together: the spec divides it into chunks of every worker's bytes of
  a block. kvagent renders it from ``engines[].cpu_cache`` and refuses to render without.
- The fs tier has no size setting and evicts nothing on disk, and no O_DIRECT switch (it
  probes O_DIRECT in its directory and falls back to buffered I/O).
"""

from __future__ import annotations

from ..errors import UsageError
from .base import EngineContext, Rendered, dump_json, indexed_names, odirect_failure, probe_notes

CONFIG_BASE = "vllm-kv-transfer-config"
CPU_CACHE_HINT = ("give the engine its CPU tier, e.g. {kind: vllm, cpu_cache: 32GiB} (host RAM "
                  "one vLLM instance pins, for all of its workers together)")


def render(ctx: EngineContext) -> Rendered:
    """One kv-transfer-config JSON per directory (one vLLM instance each)."""
    ctx.check()
    cpu_bytes = require_cpu_bytes(ctx)
    notes = probe_notes(ctx)
    names = indexed_names(CONFIG_BASE, ".json", len(ctx.directories))
    files: dict[str, str] = {}
    for name, directory in zip(names, ctx.directories, strict=True):
        files[name] = dump_json(transfer_config(directory, cpu_bytes))
        probe = ctx.probe_for(directory)
        if probe is not None and not probe.odirect_ok:
            notes.append(f"{odirect_failure(probe)}; vLLM's fs tier has no O_DIRECT setting: it "
                         "probes O_DIRECT itself and falls back to buffered I/O (page cache)")
    notes.extend(general_notes(ctx, cpu_bytes))
    return Rendered(dict(sorted(files.items())), "json", tuple(notes))


def require_cpu_bytes(ctx: EngineContext) -> int:
    """``ctx.cpu_bytes``; UsageError without it (vLLM refuses to start without its CPU tier)."""
    if ctx.cpu_bytes is None:
        raise UsageError(f"pool {ctx.pool!r}: vllm needs engines[].cpu_cache (host RAM for "
                         "vLLM's CPU tier, rendered as cpu_bytes_to_use): vLLM refuses to "
                         "start without it", CPU_CACHE_HINT)
    return ctx.cpu_bytes


def transfer_config(directory: str, cpu_bytes: int) -> dict[str, object]:
    """The ``--kv-transfer-config`` of the vLLM instance that uses ``directory``."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": cpu_bytes,
            "spec_name": "TieringOffloadingSpec",
            "secondary_tiers": [{"type": "fs", "root_dir": directory}],
        },
    }


def general_notes(ctx: EngineContext, cpu_bytes: int) -> list[str]:
    """What the operator should know about every render (true for vLLM 0.33.0)."""
    notes = [f"cpu_bytes_to_use = {cpu_bytes} bytes (engines[].cpu_cache) is host RAM for one "
             "vLLM engine, all of its tensor/pipeline-parallel workers together"]
    if ctx.data_parallel > 1:
        notes.append(f"data_parallel = {ctx.data_parallel}: each data-parallel engine pins its "
                     f"own CPU tier, {ctx.data_parallel * cpu_bytes} bytes of host RAM in all")
    if len(ctx.directories) > 1:
        notes.append("the fs tier takes one root_dir: one file per directory, for one vLLM "
                     "instance each (secondary tiers in one list are a hierarchy, not shards)")
    notes.append(
        f"vLLM's fs tier has no size setting and does not evict on disk: kvagent's cap of "
        f"{min(ctx.caps())} to {max(ctx.caps())} bytes per directory is a hard limit (the "
        "directory's xfs project quota, on pools mounted with prjquota, the default): vLLM gets "
        "ENOSPC there and stores nothing more; kvagent deletes nothing unless the engine's "
        "cleaner is turned on (engines[].cleaner: oldest files first)")
    notes.append("vLLM makes its own directories under root_dir: <model>_<hash>/config.json and "
                 "<model>_<hash>_r<rank>/<hhh>/<hh>_g<group>/<block hash>.bin, written by the "
                 "engine's scheduler (one file holds a block of all its workers); instances "
                 "with the same model and layout share blocks there, by block hash")
    notes.append("written for vLLM 0.33.0 (TieringOffloadingSpec, fs tier); pass the file's "
                 "content as --kv-transfer-config")
    return notes
