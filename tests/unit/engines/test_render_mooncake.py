"""Mooncake's renderer: one env file (and, with several ranks, one subdirectory) per store
client, sized per client by its directory's quota.

Expected names are written here from mooncake-transfer-engine 0.3.13.post1:
``mooncake/mooncake_config.py`` (MooncakeConfig.load_from_env: MOONCAKE_OFFLOAD_ENABLED,
MOONCAKE_OFFLOAD_FILE_STORAGE_PATH) and the strings of ``mooncake/store.so``
(FileStorageConfig / BucketBackendConfig::FromEnvironment); the contract test
(contract/test_mooncake.py) holds renders to the pinned wheel.
"""

from __future__ import annotations

import pytest

from agent.engines import EngineContext, render
from agent.engines.base import TierOff, engine_bytes

from .helpers import parse_env, probe

KEYS = {
    "MOONCAKE_OFFLOAD_ENABLED", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
    "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "MOONCAKE_BUCKET_MAX_TOTAL_SIZE",
    "MOONCAKE_BUCKET_EVICTION_POLICY",
}
SIZES = ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
         "MOONCAKE_BUCKET_MAX_TOTAL_SIZE")
PATH = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"


def ctx(dirs: tuple[str, ...] = ("/mnt/kv/ns0/mooncake",), cap: int = 3 * 10**9,
        **kw) -> EngineContext:
    probes = tuple(probe(d.rsplit("/", 1)[0]) for d in dirs)
    return EngineContext("pool-a", "mooncake", dirs, cap, probes, **kw)


def test_one_rank_one_file_in_the_directory_itself() -> None:
    r = render("mooncake", ctx())
    assert r.format == "env" and list(r.files) == ["mooncake.env"]
    assert r.subdirectories == ()
    env = parse_env(r.files["mooncake.env"])
    assert set(env) == KEYS
    assert env[PATH] == "/mnt/kv/ns0/mooncake"
    assert {env[k] for k in SIZES} == {"2910000000"}  # 3e9 bytes less 3% headroom
    assert env["MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY"] == "lru"
    assert env["MOONCAKE_BUCKET_EVICTION_POLICY"] == "lru"
    assert env["MOONCAKE_OFFLOAD_ENABLED"] == "true"


def test_each_rank_gets_its_own_subdirectory_and_share() -> None:
    """Clients sharing one storage path delete and evict each other's bucket files."""
    r = render("mooncake", ctx(tensor_parallel=2))
    assert list(r.files) == ["mooncake-rank0.env", "mooncake-rank1.env"]
    assert r.subdirectories == ("/mnt/kv/ns0/mooncake/rank0", "/mnt/kv/ns0/mooncake/rank1")
    envs = [parse_env(t) for t in r.files.values()]
    assert [e[PATH] for e in envs] == list(r.subdirectories)
    for env in envs:
        assert {env[k] for k in SIZES} == {"1455000000"}  # 3e9 less 3%, over 2 ranks
    assert any("own subdirectory" in n for n in r.notes)


def test_uneven_directories_tensor_and_data_parallel() -> None:
    """Each directory is sized by its own quota, over tensor_parallel x data_parallel."""
    dirs = ("/mnt/kv/ns0/mooncake", "/mnt/kv/ns1/mooncake")
    caps = (1000 * 10**9, 500 * 10**9)
    r = render("mooncake", ctx(dirs, cap=sum(caps), directory_caps=caps, tensor_parallel=2,
                               data_parallel=2))
    assert len(r.files) == 8 and len(r.subdirectories) == 8
    for i, (d, cap) in enumerate(zip(dirs, caps, strict=True)):
        for rank in range(4):
            env = parse_env(r.files[f"mooncake-{i}-rank{rank}.env"])
            assert env[PATH] == f"{d}/rank{rank}"
            assert int(env["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"]) == engine_bytes(cap, 4)
        total = sum(int(parse_env(r.files[f"mooncake-{i}-rank{k}.env"])[SIZES[0]])
                    for k in range(4))
        assert total <= cap


def test_several_directories_one_rank_need_no_subdirectory() -> None:
    dirs = ("/mnt/kv/ns0/mooncake", "/mnt/kv/ns1/mooncake")
    r = render("mooncake", ctx(dirs))
    assert list(r.files) == ["mooncake-0.env", "mooncake-1.env"] and r.subdirectories == ()
    assert [parse_env(t)[PATH] for t in r.files.values()] == list(dirs)


def test_a_share_of_zero_bytes_is_refused_not_rendered() -> None:
    """Mooncake refuses a total of 0 and reads a bucket size of 0 as 90% of the
    filesystem: a directory whose quota gives each client nothing is refused, naming it."""
    dirs = ("/mnt/kv/ns0/mooncake", "/mnt/kv/ns1/mooncake")
    with pytest.raises(TierOff) as info:
        render("mooncake", ctx(dirs, directory_caps=(3 * 10**9, 3), tensor_parallel=4))
    assert "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES would switch" in info.value.message
    assert "/mnt/kv/ns1/mooncake (quota 3 bytes) gives each of its 4 client(s) 0 bytes" in (
        info.value.message)
    assert "/mnt/kv/ns0/mooncake" not in info.value.message
