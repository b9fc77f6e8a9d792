"""SGLang's renderer: server arguments plus env files for the ``file`` or ``mooncake`` backend.

Expected names are written here from sglang 0.5.23: ``srt/environ.py`` (Envs),
``srt/mem_cache/hicache_storage.py`` (HiCacheFile), ``storage/file/lru_file_evictor.py``,
``storage/mooncake_store/mooncake_store.py`` (MooncakeStoreConfig.load_from_env; the
``rank_<dp>_<tp>_<pp>_<cp>`` subdirectory in MooncakeStore.__init__) and the strings of
mooncake-transfer-engine 0.3.13.post1's ``store.so`` for the offload sizes; the contract
test (contract/test_sglang.py) holds renders to the pinned wheels.
"""

from __future__ import annotations

import shlex

import pytest

from agent.engines import EngineContext, render
from agent.engines.base import TierOff, engine_bytes

from .helpers import parse_env, probe
from .test_render import SGLANG_ARGS, SGLANG_ENV_KEYS

MOONCAKE_ARGS = ["--enable-hierarchical-cache", "--hicache-storage-backend", "mooncake"]
MOONCAKE_KEYS = {"MOONCAKE_ENABLE_SSD_OFFLOAD", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
                 "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
                 "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
                 "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY"}
DIRS = ("/mnt/kv/ns0/sglang", "/mnt/kv/ns1/sglang")


def ctx(dirs: tuple[str, ...] = DIRS, cap: int = 8 * 10**9, **kw) -> EngineContext:
    probes = kw.pop("probes", tuple(probe(d.rsplit("/", 1)[0]) for d in dirs))
    return EngineContext("pool-a", "sglang", dirs, cap, probes, **kw)


def test_file_backend_args_and_env() -> None:
    r = render("sglang", ctx(tensor_parallel=4))
    assert r.format == "args" and r.subdirectories == ()
    assert sorted(r.files) == ["sglang-hicache-0.env", "sglang-hicache-1.env", "sglang.args"]
    assert r.format_of("sglang.args") == "args" and r.format_of("sglang-hicache-0.env") == "env"
    assert shlex.split(r.files["sglang.args"]) == SGLANG_ARGS
    for name, d in zip(["sglang-hicache-0.env", "sglang-hicache-1.env"], DIRS, strict=True):
        env = parse_env(r.files[name])
        assert set(env) == SGLANG_ENV_KEYS
        assert env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == d
        # 4e9 per directory less 3% headroom, over 4 TP ranks (one evictor each)
        assert env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] == "970000000"


def test_file_backend_is_the_default_and_sizes_each_directory_by_its_cap() -> None:
    caps = (6 * 10**9, 2 * 10**9)
    explicit = render("sglang", ctx(directory_caps=caps, data_parallel=2, backend="file"))
    assert explicit == render("sglang", ctx(directory_caps=caps, data_parallel=2))
    for name, cap in zip(["sglang-hicache-0.env", "sglang-hicache-1.env"], caps, strict=True):
        size = int(parse_env(explicit.files[name])["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"])
        assert size == engine_bytes(cap, 2) and 2 * size <= cap


def test_mooncake_backend_one_server_per_directory_rank_subdirectories() -> None:
    caps = (6 * 10**9, 2 * 10**9)
    r = render("sglang", ctx(directory_caps=caps, tensor_parallel=2, backend="mooncake"))
    assert sorted(r.files) == ["sglang-mooncake-0.env", "sglang-mooncake-1.env", "sglang.args"]
    assert shlex.split(r.files["sglang.args"]) == MOONCAKE_ARGS
    assert r.subdirectories == tuple(f"{d}/rank_0_{t}_0_0" for d in DIRS for t in (0, 1))
    for name, d, cap in zip(["sglang-mooncake-0.env", "sglang-mooncake-1.env"], DIRS, caps,
                            strict=True):
        env = parse_env(r.files[name])
        assert set(env) == MOONCAKE_KEYS
        assert env["MOONCAKE_ENABLE_SSD_OFFLOAD"] == "true"
        assert env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] == d  # SGLang appends rank_...
        assert env["MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY"] == "lru"
        for key in ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
                    "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE"):
            assert env[key] == str(engine_bytes(cap, 2))
    notes = " ".join(r.notes)
    assert "MOONCAKE_MASTER" in notes and "--enable_offload=true" in notes
    assert "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH" in notes


def test_mooncake_backend_replicas_get_their_own_base() -> None:
    """SGLang's storage dp_rank is 0 without attention DP: replicas must not share a base."""
    r = render("sglang", ctx(dirs=DIRS[:1], tensor_parallel=2, data_parallel=2,
                             backend="mooncake"))
    d = DIRS[0]
    assert sorted(r.files) == ["sglang-mooncake-replica0.env", "sglang-mooncake-replica1.env",
                               "sglang.args"]
    bases = [parse_env(r.files[f"sglang-mooncake-replica{i}.env"])
             ["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] for i in (0, 1)]
    assert bases == [f"{d}/replica0", f"{d}/replica1"]
    assert r.subdirectories == tuple(sorted(
        [f"{d}/replica{i}" for i in (0, 1)]
        + [f"{d}/replica{i}/rank_0_{t}_0_0" for i in (0, 1) for t in (0, 1)]))
    size = int(parse_env(r.files["sglang-mooncake-replica0.env"])
               ["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"])
    assert size == engine_bytes(8 * 10**9, 4)  # one directory, 4 ranks in all
    assert any("replica" in n and "attention" in n for n in r.notes)


def test_odirect_failure_is_only_a_note() -> None:
    probes = (probe("/mnt/kv/ns0", odirect=False), probe("/mnt/kv/ns1"))
    for backend in ("file", "mooncake"):
        good = render("sglang", ctx(backend=backend))
        bad = render("sglang", ctx(backend=backend, probes=probes))
        assert bad.files == good.files
        assert any("O_DIRECT" in n for n in bad.notes)


@pytest.mark.parametrize(("backend", "key"), [
    (None, "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"),
    ("mooncake", "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES")])
def test_a_share_of_zero_bytes_is_refused_not_rendered(backend: str | None, key: str) -> None:
    """SGLang's LRUFileEvictor reads MAX_SIZE 0 as no cap (never evicts) and Mooncake 0 as
    no limit: a directory whose quota gives each rank nothing is refused, naming it."""
    with pytest.raises(TierOff) as info:
        render("sglang", ctx(directory_caps=(8 * 10**9, 7), tensor_parallel=8,
                             backend=backend))
    assert f"{key} would switch its disk tier off" in info.value.message
    assert f"{DIRS[1]} (quota 7 bytes) gives each of its 8 rank(s) 0 bytes" in (
        info.value.message)
    assert DIRS[0] not in info.value.message
