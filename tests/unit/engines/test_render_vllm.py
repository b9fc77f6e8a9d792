"""vLLM's renderer: ``--kv-transfer-config`` JSON files for its bounded disk backend (no
``cpu_cache``) or for a CPU tier with an fs tier behind it (``cpu_cache``).

Expected keys are written here from vLLM 0.33.0's code: vllm/config/kv_transfer.py
(KVTransferConfig's fields), distributed/kv_transfer/kv_connector/v1/
simple_cpu_offload_connector.py (``kv_offload_backend``, ``disk_path``,
``disk_capacity_bytes``, ``use_page_cache``; ``disk_capacity_bytes`` is per worker:
v1/simple_kv_offload/worker.py sizes each worker's file from it), vllm/v1/kv_offload/
cpu/spec.py (CPUOffloadingSpec raises "cpu_bytes_to_use must be specified" without it),
vllm/v1/kv_offload/tiering/spec.py (TieringOffloadingSpec's ``secondary_tiers``) and
tiering/fs/manager.py (FileSystemTierManager's constructor). The contract test
(contract/test_vllm.py) holds renders to the pinned wheel.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.engines import EngineContext, render
from agent.engines.base import TierOff, engine_bytes

from .contract.kit import apply_pool
from .helpers import probe

GIB = 1024**3
NAME = "vllm-kv-transfer-config.json"
# vllm/config/kv_transfer.py: KVTransferConfig (pydantic, extra fields forbidden).
TOP_KEYS = {"kv_connector", "kv_role", "kv_connector_extra_config"}
# vllm/v1/kv_offload: factory.py (spec_name), cpu/spec.py (cpu_bytes_to_use),
# tiering/spec.py (secondary_tiers).
EXTRA_KEYS = {"spec_name", "cpu_bytes_to_use", "secondary_tiers"}
# tiering/fs/manager.py: FileSystemTierManager(root_dir, n_read_threads, n_write_threads,
# enable_kv_events, locality); tiering/factory.py pops type, module_path, backpressure.
FS_TIER_KEYS = {"type", "root_dir", "n_read_threads", "n_write_threads", "enable_kv_events",
                "locality", "module_path", "backpressure"}
# simple_cpu_offload_connector.py: the keys SimpleCPUOffloadConnector.__init__ reads.
DISK_KEYS = {"cpu_bytes_to_use", "cpu_bytes_to_use_per_rank", "num_cpu_blocks",
             "lazy_offload", "kv_offload_backend", "disk_path", "disk_capacity_bytes",
             "disk_buffer_slots", "use_page_cache"}


def ctx(dirs: tuple[str, ...] = ("/mnt/kv/ns0/vllm",), cpu_bytes: int | None = 32 * GIB,
        **kw) -> EngineContext:
    probes = kw.pop("probes", None)
    if probes is None:
        probes = tuple(probe(d.rsplit("/", 1)[0]) for d in dirs)
    return EngineContext("pool-a", "vllm", dirs, 100 * GIB, probes, cpu_bytes=cpu_bytes, **kw)


def test_json_keys() -> None:
    r = render("vllm", ctx())
    assert r.format == "json" and list(r.files) == [NAME] and r.subdirectories == ()
    data = json.loads(r.files[NAME])
    assert set(data) == TOP_KEYS
    assert data["kv_connector"] == "OffloadingConnector" and data["kv_role"] == "kv_both"
    extra = data["kv_connector_extra_config"]
    assert set(extra) == EXTRA_KEYS
    assert extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["cpu_bytes_to_use"] == 32 * GIB and type(extra["cpu_bytes_to_use"]) is int
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": "/mnt/kv/ns0/vllm"}]
    assert set(extra["secondary_tiers"][0]) <= FS_TIER_KEYS


def test_one_file_per_directory() -> None:
    dirs = ("/mnt/kv/ns0/vllm", "/mnt/kv/ns1/vllm")
    r = render("vllm", ctx(dirs, cpu_bytes=10 * GIB))
    assert list(r.files) == ["vllm-kv-transfer-config-0.json", "vllm-kv-transfer-config-1.json"]
    for name, d in zip(r.files, dirs, strict=True):
        extra = json.loads(r.files[name])["kv_connector_extra_config"]
        assert extra["cpu_bytes_to_use"] == 10 * GIB
        assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": d}]
    assert any("one file per directory" in n for n in r.notes)


# ------------------------------------------------------------------ disk backend

def extra_of(r, name: str = NAME) -> dict:
    data = json.loads(r.files[name])
    assert set(data) == TOP_KEYS
    assert data["kv_connector"] == "SimpleCPUOffloadConnector" and data["kv_role"] == "kv_both"
    return data["kv_connector_extra_config"]


def test_without_cpu_cache_the_bounded_disk_backend() -> None:
    """No CPU tier asked for: vLLM's disk backend, sized in bytes per worker from the
    directory's quota less headroom (100 GiB here), evicting by itself at that size."""
    r = render("vllm", ctx(cpu_bytes=None))
    assert r.format == "json" and list(r.files) == [NAME] and r.subdirectories == ()
    extra = extra_of(r)
    assert extra == {"kv_offload_backend": "disk", "disk_path": "/mnt/kv/ns0/vllm/kv-offload",
                     "disk_capacity_bytes": engine_bytes(100 * GIB)}
    assert set(extra) <= DISK_KEYS and type(extra["disk_capacity_bytes"]) is int
    notes = " ".join(r.notes)
    assert "SimpleCPUOffloadConnector" in notes and "evicts least recently used" in notes
    assert "unlinks its files at start" in notes


def test_disk_backend_each_directory_its_own_cap_each_replica_its_own_file() -> None:
    """Uneven directories, tensor_parallel 4 x data_parallel 2: every worker of every
    replica keeps a file in the directory, so each gets that directory's quota / 8; each
    replica has its own file and disk_path (device indices restart at 0 per replica)."""
    dirs = ("/mnt/kv/ns0/vllm", "/mnt/kv/ns1/vllm")
    caps = (1000 * 10**9, 500 * 10**9)
    r = render("vllm", ctx(dirs, cpu_bytes=None, directory_caps=caps, tensor_parallel=4,
                           data_parallel=2))
    assert list(r.files) == [f"vllm-kv-transfer-config-{i}-replica{k}.json"
                             for i in (0, 1) for k in (0, 1)]
    extras = {n: extra_of(r, n) for n in r.files}
    assert [e["disk_path"] for e in extras.values()] == [
        f"{d}/kv-offload-replica{k}" for d in dirs for k in (0, 1)]
    assert [e["disk_capacity_bytes"] for e in extras.values()] == [
        engine_bytes(caps[0], 8)] * 2 + [engine_bytes(caps[1], 8)] * 2
    assert any("one file per replica" in n for n in r.notes)


def test_disk_backend_uses_the_page_cache_only_where_odirect_failed() -> None:
    dirs = ("/mnt/kv/ns0/vllm", "/mnt/kv/ns1/vllm")
    probes = (probe("/mnt/kv/ns0"), probe("/mnt/kv/ns1", odirect=False))
    r = render("vllm", ctx(dirs, cpu_bytes=None, probes=probes))
    first, second = (extra_of(r, n) for n in r.files)
    assert "use_page_cache" not in first and second["use_page_cache"] is True
    assert any("use_page_cache true because O_DIRECT open failed" in n for n in r.notes)


def test_disk_backend_share_of_zero_is_refused() -> None:
    """vLLM refuses disk_capacity_bytes 0 (its disk tier off): kvagent refuses first,
    naming the directory."""
    dirs = ("/mnt/kv/ns0/vllm", "/mnt/kv/ns1/vllm")
    with pytest.raises(TierOff) as info:
        render("vllm", ctx(dirs, cpu_bytes=None, directory_caps=(100 * GIB, 3),
                           tensor_parallel=4))
    assert "disk_capacity_bytes would switch its disk tier off" in info.value.message
    assert "/mnt/kv/ns1/vllm (quota 3 bytes) gives each of its 4 worker(s) 0 bytes" in (
        info.value.message)


# ------------------------------------------------------------------ fs tier


def test_cpu_tier_is_per_engine_and_data_parallel_multiplies_it() -> None:
    one = render("vllm", ctx(tensor_parallel=4))
    dp = render("vllm", ctx(data_parallel=2))
    assert one.files == dp.files  # neither parallel size changes what vLLM is told
    assert not any("data_parallel" in n for n in one.notes)
    assert any(f"{2 * 32 * GIB} bytes of host RAM" in n for n in dp.notes)


def test_without_odirect_only_notes() -> None:
    d = "/mnt/kv/ns0/vllm"
    good = render("vllm", ctx((d,)))
    bad = render("vllm", ctx((d,), probes=(probe("/mnt/kv/ns0", odirect=False),)))
    assert bad.files == good.files  # vLLM has no O_DIRECT key: nothing to switch
    assert any("falls back to buffered" in n for n in bad.notes)


def test_notes_say_what_bounds_the_fs_tier() -> None:
    """The fs tier has no size: the cleaner bounds it (on by default), or, turned off,
    the notes say the tier stops storing once full."""
    on = " ".join(render("vllm", ctx(cleaner=True)).notes)
    assert "no size setting" in on and "project quota" in on and "_r<rank>" in on
    assert "kvagent's cleaner (engines[].cleaner, on by default for it) deletes" in on
    off = " ".join(render("vllm", ctx()).notes)
    assert "the cleaner is off" in off and "stores nothing more" in off


# ------------------------------------------------------------------ through an apply

def test_apply_without_cpu_cache_renders_the_disk_backend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without cpu_cache the apply renders the disk backend (before, an error of the pool:
    no render at all), one file per directory, each sized from its own quota."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: vllm", "kind: mooncake"],
                         sizes=(1000 * 10**9, 500 * 10**9))
    assert applied.result.ok, applied.result.errors
    files = applied.files("vllm")
    assert sorted(files) == ["vllm-kv-transfer-config-0.json", "vllm-kv-transfer-config-1.json"]
    caps = applied.context("vllm").caps()
    for text, mount, cap in zip(files.values(), applied.mounts, caps, strict=True):
        extra = json.loads(text)["kv_connector_extra_config"]
        assert extra["disk_path"] == f"{mount}/vllm/kv-offload"
        assert extra["disk_capacity_bytes"] == engine_bytes(cap)
    assert applied.files("mooncake")


def test_apply_with_cpu_cache_renders_the_fs_tier_with_the_cleaner_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    applied = apply_pool(tmp_path, monkeypatch, ["kind: vllm, cpu_cache: 32GiB"])
    assert applied.result.ok, applied.result.errors
    files = applied.files("vllm")
    assert sorted(files) == ["vllm-kv-transfer-config-0.json", "vllm-kv-transfer-config-1.json"]
    for text, mount in zip(files.values(), applied.mounts, strict=True):
        extra = json.loads(text)["kv_connector_extra_config"]
        assert extra["cpu_bytes_to_use"] == 32 * GIB
        assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": f"{mount}/vllm"}]
    assert applied.context("vllm").cleaner is True
