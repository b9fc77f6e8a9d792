"""Every renderer's output, parsed back and compared with the keys each engine documents.

The expected key sets are written here from the engines' own sources (cited
next to each), not taken from the renderers' constants.
"""

from __future__ import annotations

import errno
import json
import re
import shlex

import pytest
import yaml

from agent.config.model import EngineKind
from agent.engines import KINDS, EngineContext, render
from agent.engines.dynamo import GdsNotReady
from agent.errors import UsageError
from agent.system.gds import GdsReadiness

from .helpers import parse_env, probe

GIB = 1024**3

# LMCache/LMCache lmcache/v1/config.py, _CONFIG_DEFINITIONS (the keys LMCache knows;
# unknown keys are only logged as "Unknown configuration key").
LMCACHE_KNOWN_KEYS = {
    "chunk_size", "local_cpu", "max_local_cpu_size", "local_disk", "local_disk_path_sharding",
    "max_local_disk_size", "remote_url", "remote_serde", "use_layerwise", "save_decode_cache",
    "gds_path", "extra_config", "cache_policy",
}
# The disk-offload keys from LMCache's docs (docs/source/kv_cache/storage_backends/
# local_storage.rst): local_disk, max_local_disk_size, extra_config {'use_odirect': ...}.
LMCACHE_DISK_KEYS = {"local_disk", "max_local_disk_size", "extra_config"}
LMCACHE_EXTRA_KEYS = {"use_odirect"}

# vllm-project/vllm docs/features/kv_offloading_usage.md, "Multi-Tier Setup" and the
# kv_connector_extra_config / Filesystem (FS) tables.
VLLM_TOP_KEYS = {"kv_connector", "kv_role", "kv_connector_extra_config"}
VLLM_EXTRA_DOCUMENTED = {
    "spec_name", "cpu_bytes_to_use", "block_size", "blocks_per_chunk", "eviction_policy",
    "cache_policy_module_path", "store_threshold", "max_tracker_size", "secondary_tiers",
    "offload_prompt_only", "self_describing_kv_events", "spec_module_path",
}
VLLM_FS_TIER_DOCUMENTED = {"type", "root_dir", "n_read_threads", "n_write_threads",
                           "enable_kv_events", "locality"}

# ai-dynamo/dynamo lib/llm/src/block_manager/storage/disk.rs (DISK_CACHE_KEY,
# DISK_ZEROFILL_FALLBACK_KEY, DISK_DISABLE_O_DIRECT_KEY) and
# lib/runtime/src/config/environment_names.rs (kvbm::disk_cache::DYN_KVBM_DISK_CACHE_GB).
DYNAMO_BASE_KEYS = {"DYN_KVBM_DISK_CACHE_DIR", "DYN_KVBM_DISK_CACHE_GB"}
DYNAMO_NO_ODIRECT = "DYN_KVBM_DISK_DISABLE_O_DIRECT"
DYNAMO_ZEROFILL = "DYN_KVBM_DISK_ZEROFILL_FALLBACK"

# sgl-project/sglang python/sglang/srt/environ.py and mem_cache/hicache_storage.py
# (HiCacheFile) / storage/file/lru_file_evictor.py; server_args.py for the flags.
SGLANG_ENV_KEYS = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR",
                   "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"}
SGLANG_ARGS = ["--enable-hierarchical-cache", "--hicache-storage-backend", "file"]

# kvcache-ai/Mooncake mooncake-store/src/config/file_storage_config.cpp,
# config/bucket_backend_config.cpp, mooncake-wheel/mooncake/mooncake_config.py.
MOONCAKE_KEYS = {
    "MOONCAKE_OFFLOAD_ENABLED", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
    "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "MOONCAKE_BUCKET_MAX_TOTAL_SIZE",
    "MOONCAKE_BUCKET_EVICTION_POLICY",
}


def ctx(kind: EngineKind, dirs: tuple[str, ...] = ("/mnt/kv/ns0/x",), cap: int = 100 * GIB,
        probes=None, **kw) -> EngineContext:
    if probes is None:
        probes = tuple(probe(d.rsplit("/", 1)[0]) for d in dirs)
    if "ranks" in kw:
        kw["tensor_parallel"] = kw.pop("ranks")
    return EngineContext("pool-a", kind, dirs, cap, probes, **kw)


def lmcache_strip(value: str) -> str:
    """What LMCache's _parse_local_disk makes of one entry (config_base.py)."""
    return value[7:] if re.match(r"file://(.*)/", value) else value


# ------------------------------------------------------------------ LMCache

def test_lmcache_yaml_keys_and_values() -> None:
    r = render("lmcache", ctx("lmcache", ("/mnt/kv/ns0/lmcache",), cap=100 * GIB))
    assert r.format == "yaml" and list(r.files) == ["lmcache.yaml"]
    data = yaml.safe_load(r.files["lmcache.yaml"])
    assert set(data) == LMCACHE_DISK_KEYS
    assert set(data) <= LMCACHE_KNOWN_KEYS
    assert set(data["extra_config"]) == LMCACHE_EXTRA_KEYS
    assert lmcache_strip(data["local_disk"]) == "/mnt/kv/ns0/lmcache/"
    assert data["max_local_disk_size"] == 100.0  # 100 GiB, LMCache multiplies by 1024**3
    assert data["extra_config"]["use_odirect"] is True


def test_lmcache_several_directories_share_the_cap_per_worker() -> None:
    dirs = tuple(f"/mnt/kv/ns{i}/lmcache" for i in range(4))
    r = render("lmcache", ctx("lmcache", dirs, cap=10**12, ranks=2))
    data = yaml.safe_load(r.files["lmcache.yaml"])
    assert set(data) == LMCACHE_DISK_KEYS | {"local_disk_path_sharding"}
    assert data["local_disk_path_sharding"] == "by_gpu"
    assert [lmcache_strip(p) for p in data["local_disk"].split(",")] == [d + "/" for d in dirs]
    # 10^12 bytes over max(2 ranks, 4 dirs) = 250e9 bytes = 232.8306... GiB, rounded down
    assert data["max_local_disk_size"] == 232.83
    assert data["max_local_disk_size"] * GIB * 4 <= 10**12


def test_lmcache_falls_back_without_odirect() -> None:
    d = "/mnt/kv/ns0/lmcache"
    r = render("lmcache", ctx("lmcache", (d,), probes=(probe("/mnt/kv/ns0", odirect=False),)))
    assert yaml.safe_load(r.files["lmcache.yaml"])["extra_config"]["use_odirect"] is False
    assert any("use_odirect false" in n and "EINVAL" in n for n in r.notes)


def test_lmcache_one_unprobed_directory_keeps_odirect_off() -> None:
    dirs = ("/mnt/kv/ns0/lmcache", "/mnt/kv/ns1/lmcache")
    r = render("lmcache", ctx("lmcache", dirs, probes=(probe("/mnt/kv/ns0"),)))
    assert yaml.safe_load(r.files["lmcache.yaml"])["extra_config"]["use_odirect"] is False
    assert any("/mnt/kv/ns1/lmcache: no probe result" in n for n in r.notes)


# ------------------------------------------------------------------ vLLM

def test_vllm_json_keys() -> None:
    r = render("vllm", ctx("vllm", ("/mnt/kv/ns0/vllm",)))
    assert r.format == "json" and list(r.files) == ["vllm-kv-transfer-config.json"]
    data = json.loads(r.files["vllm-kv-transfer-config.json"])
    assert set(data) == VLLM_TOP_KEYS
    assert data["kv_connector"] == "OffloadingConnector"
    assert data["kv_role"] == "kv_both"
    extra = data["kv_connector_extra_config"]
    assert set(extra) == {"spec_name", "secondary_tiers"}
    assert set(extra) <= VLLM_EXTRA_DOCUMENTED
    assert extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": "/mnt/kv/ns0/vllm"}]
    assert set(extra["secondary_tiers"][0]) <= VLLM_FS_TIER_DOCUMENTED
    assert any("cpu_bytes_to_use is required" in n for n in r.notes)


def test_vllm_cpu_bytes_and_one_file_per_directory() -> None:
    dirs = ("/mnt/kv/ns0/vllm", "/mnt/kv/ns1/vllm")
    r = render("vllm", ctx("vllm", dirs, cpu_bytes=10 * GIB))
    assert list(r.files) == ["vllm-kv-transfer-config-0.json", "vllm-kv-transfer-config-1.json"]
    for name, d in zip(r.files, dirs, strict=True):
        extra = json.loads(r.files[name])["kv_connector_extra_config"]
        assert set(extra) == {"spec_name", "secondary_tiers", "cpu_bytes_to_use"}
        assert extra["cpu_bytes_to_use"] == 10 * GIB
        assert extra["secondary_tiers"][0]["root_dir"] == d
    assert not any("cpu_bytes_to_use is required" in n for n in r.notes)


def test_vllm_without_odirect_only_notes() -> None:
    d = "/mnt/kv/ns0/vllm"
    good = render("vllm", ctx("vllm", (d,)))
    bad = render("vllm", ctx("vllm", (d,), probes=(probe("/mnt/kv/ns0", odirect=False),)))
    assert bad.files == good.files  # vLLM has no O_DIRECT key: nothing to switch
    assert any("falls back to buffered" in n for n in bad.notes)


# ------------------------------------------------------------------ Dynamo KVBM

def test_dynamo_env_keys_and_decimal_gb() -> None:
    r = render("dynamo", ctx("dynamo", ("/mnt/kv/ns0/dynamo",), cap=1_234_567_890_123))
    assert r.format == "env" and list(r.files) == ["dynamo-kvbm.env"]
    env = parse_env(r.files["dynamo-kvbm.env"])
    assert set(env) == DYNAMO_BASE_KEYS
    assert env["DYN_KVBM_DISK_CACHE_DIR"] == "/mnt/kv/ns0/dynamo"
    assert env["DYN_KVBM_DISK_CACHE_GB"] == "1234"  # decimal GB, rounded down


def test_dynamo_splits_per_directory() -> None:
    dirs = ("/mnt/kv/ns0/dynamo", "/mnt/kv/ns1/dynamo")
    r = render("dynamo", ctx("dynamo", dirs, cap=1_234_567_890_123))
    assert list(r.files) == ["dynamo-kvbm-0.env", "dynamo-kvbm-1.env"]
    envs = [parse_env(t) for t in r.files.values()]
    assert [e["DYN_KVBM_DISK_CACHE_DIR"] for e in envs] == list(dirs)
    assert {e["DYN_KVBM_DISK_CACHE_GB"] for e in envs} == {"617"}  # 617283945061 bytes each


def test_dynamo_fallbacks_when_probes_fail() -> None:
    d = "/mnt/kv/ns0/dynamo"
    p = probe("/mnt/kv/ns0", odirect=False, fallocate=False, fallocate_errno=errno.EOPNOTSUPP)
    r = render("dynamo", ctx("dynamo", (d,), probes=(p,)))
    env = parse_env(r.files["dynamo-kvbm.env"])
    assert set(env) == DYNAMO_BASE_KEYS | {DYNAMO_NO_ODIRECT, DYNAMO_ZEROFILL}
    assert env[DYNAMO_NO_ODIRECT] == "true" and env[DYNAMO_ZEROFILL] == "true"
    assert any(DYNAMO_NO_ODIRECT in n and "O_DIRECT open failed" in n for n in r.notes)
    assert any(DYNAMO_ZEROFILL in n and f"errno {errno.EOPNOTSUPP}" in n for n in r.notes)


def test_dynamo_never_writes_switches_when_probes_pass() -> None:
    # KVBM reads these two by presence (std::env::var(..).is_ok()): even "false" switches on.
    env = parse_env(render("dynamo", ctx("dynamo", ("/mnt/kv/ns0/dynamo",))).files[
        "dynamo-kvbm.env"])
    assert DYNAMO_NO_ODIRECT not in env and DYNAMO_ZEROFILL not in env


def test_dynamo_fallocate_that_reserves_nothing_is_only_noted() -> None:
    p = probe("/mnt/kv/ns0", fallocate=False, fallocate_errno=None)
    r = render("dynamo", ctx("dynamo", ("/mnt/kv/ns0/dynamo",), probes=(p,)))
    assert set(parse_env(r.files["dynamo-kvbm.env"])) == DYNAMO_BASE_KEYS
    assert any("zero-fills only when fallocate reports EOPNOTSUPP" in n for n in r.notes)


READY = GdsReadiness("/sys/module/nvidia_fs", "/dev/nvidia-fs0",
                     "/usr/lib/x86_64-linux-gnu/libcufile.so.0")


def test_dynamo_renders_where_gds_is_ready_and_says_so() -> None:
    r = render("dynamo", ctx("dynamo", ("/mnt/kv/ns0/dynamo",), gds=READY))
    assert set(parse_env(r.files["dynamo-kvbm.env"])) == DYNAMO_BASE_KEYS
    assert any("nvidia-fs loaded" in n and READY.cufile in n for n in r.notes), r.notes


@pytest.mark.parametrize(("gds", "named"), [
    (GdsReadiness(None, None, READY.cufile), ["nvidia-fs kernel module is not loaded"]),
    (GdsReadiness(READY.nvidia_fs_module, None, READY.cufile), ["no device nodes"]),
    (GdsReadiness(READY.nvidia_fs_module, READY.nvidia_fs_devices, None), ["cuFile"]),
    (GdsReadiness(None, None, None), ["nvidia-fs kernel module", "cuFile"]),
])
def test_dynamo_refuses_without_gds_naming_what_is_missing(gds: GdsReadiness,
                                                           named: list[str]) -> None:
    with pytest.raises(GdsNotReady) as info:
        render("dynamo", ctx("dynamo", ("/mnt/kv/ns0/dynamo",), gds=gds))
    err = info.value
    assert not isinstance(err, UsageError)  # the host, not the config: exit 1
    assert "GPUDirect Storage" in err.message and "#6032" in err.message
    for words in named:
        assert words in err.message
    assert "modprobe nvidia-fs" in err.hint and "gds: trust" in err.hint


def test_dynamo_not_checked_says_so() -> None:
    r = render("dynamo", ctx("dynamo", ("/mnt/kv/ns0/dynamo",)))
    assert any("not checked (gds: trust)" in n for n in r.notes)


@pytest.mark.parametrize("kind", ["lmcache", "vllm", "sglang", "mooncake"])
def test_only_dynamo_depends_on_gds(kind: EngineKind) -> None:
    """The other renderers never refuse for GDS (LMCache's gds_path is not rendered)."""
    r = render(kind, ctx(kind, (f"/mnt/kv/ns0/{kind}",), gds=GdsReadiness(None, None, None)))
    assert r.files and "gds_path" not in "".join(r.files.values())


@pytest.mark.parametrize("kind", ["lmcache", "vllm", "sglang"])
def test_notes_promise_no_cleanup_that_does_not_exist(kind: EngineKind) -> None:
    """Caps are hard limits (project quotas); nothing is deleted unless the cleaner is on."""
    notes = " ".join(render(kind, ctx(kind, (f"/mnt/kv/ns0/{kind}",))).notes)
    assert "cleanup" not in notes
    assert "project quota" in notes and "engines[].cleaner" in notes


# ------------------------------------------------------------------ SGLang

def test_sglang_args_and_env() -> None:
    dirs = ("/mnt/kv/ns0/sglang", "/mnt/kv/ns1/sglang")
    r = render("sglang", ctx("sglang", dirs, cap=8 * 10**9, ranks=4))
    assert r.format == "args"
    assert sorted(r.files) == ["sglang-hicache-0.env", "sglang-hicache-1.env", "sglang.args"]
    assert r.format_of("sglang.args") == "args" and r.format_of("sglang-hicache-0.env") == "env"
    assert shlex.split(r.files["sglang.args"]) == SGLANG_ARGS
    for name, d in zip(["sglang-hicache-0.env", "sglang-hicache-1.env"], dirs, strict=True):
        env = parse_env(r.files[name])
        assert set(env) == SGLANG_ENV_KEYS
        assert env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == d
        assert env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] == "1000000000"  # 4e9 / 4 ranks


# ------------------------------------------------------------------ Mooncake

def test_mooncake_env() -> None:
    r = render("mooncake", ctx("mooncake", ("/mnt/kv/ns0/mooncake",), cap=3 * 10**9, ranks=2))
    assert r.format == "env" and list(r.files) == ["mooncake.env"]
    env = parse_env(r.files["mooncake.env"])
    assert set(env) == MOONCAKE_KEYS
    assert env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] == "/mnt/kv/ns0/mooncake"
    assert env["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"] == "1500000000"
    assert env["MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE"] == "1500000000"
    assert env["MOONCAKE_BUCKET_MAX_TOTAL_SIZE"] == "1500000000"
    assert env["MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY"] in ("none", "fifo", "lru")
    assert env["MOONCAKE_OFFLOAD_ENABLED"] == "true"


# ------------------------------------------------------------------ all engines

def test_kinds_are_the_config_models() -> None:
    from typing import get_args

    assert set(KINDS) == set(get_args(EngineKind))


@pytest.mark.parametrize("kind", KINDS)
def test_rendering_is_deterministic(kind: str) -> None:
    dirs = (f"/mnt/kv/ns0/{kind}", f"/mnt/kv/ns1/{kind}")
    probes = (probe("/mnt/kv/ns1", odirect=False), probe("/mnt/kv/ns0"))
    first = render(kind, ctx(kind, dirs, probes=probes))
    again = render(kind, ctx(kind, dirs, probes=tuple(reversed(probes))))
    assert first == again
    assert list(first.files) == sorted(first.files)


@pytest.mark.parametrize("kind", KINDS)
def test_every_file_parses_in_its_format(kind: str) -> None:
    r = render(kind, ctx(kind, (f"/mnt/kv/ns0/{kind}", f"/mnt/kv/ns1/{kind}")))
    for name, text in r.files.items():
        fmt = r.format_of(name)
        if fmt == "yaml":
            assert isinstance(yaml.safe_load(text), dict)
        elif fmt == "json":
            assert isinstance(json.loads(text), dict)
        elif fmt == "env":
            assert parse_env(text)
        else:
            assert shlex.split(text)


def test_env_values_with_spaces_are_quoted() -> None:
    d = '/mnt/kv space/ns0/"dyn"$x'
    env = parse_env(render("dynamo", ctx("dynamo", (d,))).files["dynamo-kvbm.env"])
    assert env["DYN_KVBM_DISK_CACHE_DIR"] == d


def test_probe_of_the_longest_matching_mount_is_used() -> None:
    p_root = probe("/mnt/kv", odirect=True)
    p_ns = probe("/mnt/kv/ns0", odirect=False)
    c = ctx("dynamo", ("/mnt/kv/ns0/dynamo",), probes=(p_root, p_ns))
    assert c.probe_for("/mnt/kv/ns0/dynamo") is p_ns
    assert c.probe_for("/mnt/kv/ns00/dynamo") is p_root
    assert c.probe_for("/elsewhere/dynamo") is None


@pytest.mark.parametrize(("bad", "message"), [
    ({"dirs": ()}, "no directories"),
    ({"dirs": ("relative/dir",)}, "absolute"),
    ({"dirs": ("/a/b/../c",)}, "normalised"),
    ({"dirs": ("/a/x", "/a/x")}, "twice"),
    ({"dirs": ("/a,b",)}, "','"),
    ({"cap": 0}, "no capacity"),
    ({"ranks": 0}, "tensor_parallel"),
])
def test_bad_context_is_a_usage_error(bad: dict, message: str) -> None:
    kw = {"dirs": ("/mnt/kv/ns0/lmcache",), "cap": GIB} | bad
    c = EngineContext("pool-a", "lmcache", kw["dirs"], kw["cap"], (),
                      tensor_parallel=bad.get("ranks", 1))
    with pytest.raises(UsageError, match=message):
        render("lmcache", c)


def test_unknown_engine_and_mismatched_kind() -> None:
    with pytest.raises(UsageError, match="unknown engine 'redis'"):
        render("redis", ctx("lmcache"))
    with pytest.raises(UsageError, match="not 'vllm'"):
        render("vllm", ctx("lmcache"))
