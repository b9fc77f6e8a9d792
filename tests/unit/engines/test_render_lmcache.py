"""LMCache's renderer: one ``lmcache.yaml`` whose ``max_local_disk_size`` (GiB, per worker)
keeps every directory's workers under its quota.

Expected keys and arithmetic are written here from the lmcache 0.5.6 wheel:
``lmcache/v1/config.py`` (``_CONFIG_DEFINITIONS``), ``config_base.py``
(``_parse_local_disk`` strips ``file://`` from each comma-separated entry),
``storage_backend/path_sharder.py`` (device ``d`` -> ``paths[d % len(paths)]``) and
``storage_backend/local_disk_backend.py`` (``int(max_local_disk_size * 1024**3)`` bytes per
LocalDiskBackend, one per worker); contract/test_lmcache.py holds renders to the wheel.
"""

from __future__ import annotations

import pytest
import yaml

from agent.engines import EngineContext, render
from agent.engines.base import TierOff, engine_bytes
from agent.engines.lmcache import gib_floor, workers_per_directory

from .helpers import probe

GIB = 1024**3
GB = 1000**3
# lmcache/v1/config.py _CONFIG_DEFINITIONS: the keys kvagent may write.
KNOWN_KEYS = {"local_disk", "local_disk_path_sharding", "max_local_disk_size", "extra_config"}
# lmcache/v1/storage_backend/local_disk_backend.py: extra_config.get("use_odirect", False).
EXTRA_KEYS = {"use_odirect"}


def ctx(dirs: tuple[str, ...] = ("/mnt/kv/ns0/lmcache",), cap: int = 100 * GIB,
        probes=None, **kw) -> EngineContext:
    if probes is None:
        probes = tuple(probe(d.rsplit("/", 1)[0]) for d in dirs)
    return EngineContext("pool-a", "lmcache", dirs, cap, probes, **kw)


def load(c: EngineContext) -> dict:
    r = render("lmcache", c)
    assert r.format == "yaml" and list(r.files) == ["lmcache.yaml"]
    return yaml.safe_load(r.files["lmcache.yaml"])


def strip(entry: str) -> str:
    """What _parse_local_disk makes of one entry of local_disk."""
    return entry[7:] if entry.startswith("file://") else entry


def workers_on(directory: int, n: int, tp: int, dp: int) -> int:
    """PathSharder's placement, worst case: each instance's tp consecutive devices start
    at any device; dp instances."""
    return dp * max(sum((s + k) % n == directory for k in range(tp)) for s in range(n))


def test_one_directory_keys_and_values() -> None:
    data = load(ctx())
    assert set(data) == {"local_disk", "max_local_disk_size", "extra_config"} <= KNOWN_KEYS
    assert set(data["extra_config"]) == EXTRA_KEYS
    assert strip(data["local_disk"]) == "/mnt/kv/ns0/lmcache/"
    # 100 GiB less 3% headroom = 97 GiB for the one worker; LMCache multiplies by 1024**3
    assert data["max_local_disk_size"] == 97.0
    assert data["extra_config"]["use_odirect"] is True


def test_several_directories_are_sharded_by_gpu() -> None:
    dirs = tuple(f"/mnt/kv/ns{i}/lmcache" for i in range(4))
    data = load(ctx(dirs, cap=10**12, tensor_parallel=2))
    assert set(data) == KNOWN_KEYS
    assert data["local_disk_path_sharding"] == "by_gpu"
    assert [strip(p) for p in data["local_disk"].split(",")] == [d + "/" for d in dirs]
    # 2 consecutive devices over 4 paths: one worker per directory, 250e9 bytes each
    assert data["max_local_disk_size"] == gib_floor(engine_bytes(250 * GB, 1)) == 225.84


def test_uneven_directories_are_sized_by_the_smallest() -> None:
    dirs = ("/mnt/kv/ns0/lmcache", "/mnt/kv/ns1/lmcache")
    caps = (900 * GB, 450 * GB)
    data = load(ctx(dirs, cap=sum(caps), directory_caps=caps, tensor_parallel=4))
    size = data["max_local_disk_size"]
    assert size == gib_floor(engine_bytes(450 * GB, 2))
    for i, cap in enumerate(caps):
        assert workers_on(i, 2, 4, 1) * int(size * GIB) <= engine_bytes(cap)


@pytest.mark.parametrize(("n", "tp", "dp"), [
    (1, 1, 1), (1, 4, 1), (1, 2, 3), (2, 1, 1), (2, 1, 2), (2, 2, 1), (2, 3, 1), (2, 4, 2),
    (3, 4, 1), (3, 2, 2), (4, 2, 1), (4, 8, 1), (4, 6, 3),
])
def test_workers_per_directory_bounds_path_sharder_placement(n: int, tp: int, dp: int) -> None:
    c = ctx(tuple(f"/mnt/kv/ns{i}/lmcache" for i in range(n)),
            tensor_parallel=tp, data_parallel=dp)
    assert workers_per_directory(c) == max(workers_on(i, n, tp, dp) for i in range(n))
    assert workers_per_directory(c) <= c.ranks


@pytest.mark.parametrize(("caps", "tp", "dp"), [
    ((10**12,), 1, 1), ((10**12,), 8, 1), ((10**12, 5 * 10**11), 1, 2),
    ((10**12, 5 * 10**11), 3, 1), ((7 * 10**11, 3 * 10**11, 10**11), 4, 2),
    ((25 * GIB // 100 * 100,), 1, 1), ((123_456_789_012,), 7, 3),
])
def test_every_directory_stays_under_its_quota(caps: tuple[int, ...], tp: int, dp: int) -> None:
    """For every directory: workers that can land on it × LMCache's bytes <= engine_bytes."""
    n = len(caps)
    c = ctx(tuple(f"/mnt/kv/ns{i}/lmcache" for i in range(n)), cap=sum(caps),
            directory_caps=caps, tensor_parallel=tp, data_parallel=dp)
    each = int(load(c)["max_local_disk_size"] * 1024**3)
    assert each > 0
    for i, cap in enumerate(caps):
        assert workers_on(i, n, tp, dp) * each <= engine_bytes(cap)


def test_gib_floor_never_rounds_up() -> None:
    for n in (GIB, 10**12, 25 * GIB // 100, 97 * GIB // 100 * 7, 1, 0, 5 * GIB):
        size = gib_floor(n)
        assert int(size * GIB) <= n and size >= 0
        assert n - int(size * GIB) < GIB // 100 + 1


def test_notes_say_what_was_assumed() -> None:
    dirs = ("/mnt/kv/ns0/lmcache", "/mnt/kv/ns1/lmcache")
    r = render("lmcache", ctx(dirs, tensor_parallel=2, data_parallel=2))
    text = "\n".join(r.notes)
    assert "max_local_disk_size is per LMCache worker in GiB" in text
    assert "up to 2 worker(s) on one directory" in text
    assert "4 worker(s) in all (tensor_parallel 2 × data_parallel 2)" in text
    assert "consecutive CUDA devices" in text and "d % 2" in text


def test_a_share_below_a_hundredth_gib_is_refused_not_rendered_as_zero() -> None:
    """max_local_disk_size 0 makes no LocalDiskBackend (LMCache's disk tier off): refused,
    naming the directory that is too small, not rendered with a note."""
    dirs = ("/mnt/kv/ns0/lmcache", "/mnt/kv/ns1/lmcache")
    with pytest.raises(TierOff) as info:
        render("lmcache", ctx(dirs, cap=100 * GIB, directory_caps=(100 * GIB, GIB // 200)))
    assert "max_local_disk_size would switch its disk tier off" in info.value.message
    assert f"/mnt/kv/ns1/lmcache (quota {GIB // 200} bytes)" in info.value.message
    assert "/mnt/kv/ns0/lmcache" not in info.value.message
    assert "below 0.01 GiB" in info.value.message


def test_falls_back_without_odirect() -> None:
    d = "/mnt/kv/ns0/lmcache"
    data_r = render("lmcache", ctx((d,), probes=(probe("/mnt/kv/ns0", odirect=False),)))
    assert yaml.safe_load(data_r.files["lmcache.yaml"])["extra_config"]["use_odirect"] is False
    assert any("use_odirect false" in n and "EINVAL" in n for n in data_r.notes)


def test_one_unprobed_directory_keeps_odirect_off() -> None:
    dirs = ("/mnt/kv/ns0/lmcache", "/mnt/kv/ns1/lmcache")
    r = render("lmcache", ctx(dirs, probes=(probe("/mnt/kv/ns0"),)))
    assert yaml.safe_load(r.files["lmcache.yaml"])["extra_config"]["use_odirect"] is False
    assert any("/mnt/kv/ns1/lmcache: no probe result" in n for n in r.notes)
