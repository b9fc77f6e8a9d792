"""Dynamo KVBM's renderer: env keys, decimal GB sized by each file's own directory's quota
(a share below 1 GB refused, never rendered as 0), presence switches only on failed
probes, and the GPUDirect Storage refusal.

Expected names are written here from kvbm 1.6.1's ``kvbm/_core.abi3.so`` strings and
ai-dynamo/dynamo lib/llm/src/block_manager/storage/disk.rs (DISK_CACHE_KEY,
DISK_ZEROFILL_FALLBACK_KEY, DISK_DISABLE_O_DIRECT_KEY) and
lib/llm/src/block_manager/distributed/leader.rs (compute_num_blocks: GB x 10^9 over the
bytes per block summed across the instance's TP workers); the contract test
(contract/test_dynamo.py) holds renders to the pinned wheel.
"""

from __future__ import annotations

import errno

import pytest

from agent.engines import EngineContext, render
from agent.engines.base import TierOff, engine_bytes
from agent.engines.dynamo import GdsNotReady
from agent.errors import UsageError
from agent.system.gds import GdsReadiness

from .helpers import parse_env, probe

BASE_KEYS = {"DYN_KVBM_DISK_CACHE_DIR", "DYN_KVBM_DISK_CACHE_GB"}
NO_ODIRECT = "DYN_KVBM_DISK_DISABLE_O_DIRECT"
ZEROFILL = "DYN_KVBM_DISK_ZEROFILL_FALLBACK"
GB = 10**9
READY = GdsReadiness("/sys/module/nvidia_fs", "/dev/nvidia-fs0",
                     "/usr/lib/x86_64-linux-gnu/libcufile.so.0")


def ctx(dirs: tuple[str, ...] = ("/mnt/kv/ns0/dynamo",), cap: int = 100 * GB, probes=None,
        **kw) -> EngineContext:
    if probes is None:
        probes = tuple(probe(d.rsplit("/", 1)[0]) for d in dirs)
    return EngineContext("pool-a", "dynamo", dirs, cap, probes, **kw)


def test_env_keys_and_decimal_gb_under_the_quota() -> None:
    r = render("dynamo", ctx(cap=1_234_567_890_123))
    assert r.format == "env" and list(r.files) == ["dynamo-kvbm.env"]
    env = parse_env(r.files["dynamo-kvbm.env"])
    assert set(env) == BASE_KEYS
    assert env["DYN_KVBM_DISK_CACHE_DIR"] == "/mnt/kv/ns0/dynamo"
    # 1_234_567_890_123 less 3% headroom = 1_197_530_853_419 bytes: decimal GB, rounded down
    assert env["DYN_KVBM_DISK_CACHE_GB"] == "1197"
    assert r.subdirectories == ()


def test_each_directory_gets_its_own_quota() -> None:
    """Each env file is for the KVBM instances of its own directory: uneven namespaces
    give each file its own directory's size (the issue: both were sized by the smaller,
    the 1 TB directory got 485 of its 1000 GB)."""
    dirs = ("/mnt/kv/ns0/dynamo", "/mnt/kv/ns1/dynamo")
    r = render("dynamo", ctx(dirs, cap=1500 * GB, directory_caps=(1000 * GB, 500 * GB)))
    assert list(r.files) == ["dynamo-kvbm-0.env", "dynamo-kvbm-1.env"]
    envs = [parse_env(t) for t in r.files.values()]
    assert [e["DYN_KVBM_DISK_CACHE_DIR"] for e in envs] == list(dirs)
    # 1000 GB and 500 GB less 3% headroom
    assert [e["DYN_KVBM_DISK_CACHE_GB"] for e in envs] == ["970", "485"]


def test_tensor_parallel_is_not_split_data_parallel_is() -> None:
    """The leader sums its TP workers' bytes per block (the size is the instance's);
    data-parallel instances sharing the directory split it."""
    tp = parse_env(render("dynamo", ctx(cap=100 * GB, tensor_parallel=4)).files[
        "dynamo-kvbm.env"])
    dp = parse_env(render("dynamo", ctx(cap=100 * GB, data_parallel=4)).files[
        "dynamo-kvbm.env"])
    assert tp["DYN_KVBM_DISK_CACHE_GB"] == "97"
    assert dp["DYN_KVBM_DISK_CACHE_GB"] == str(engine_bytes(100 * GB, 4) // GB) == "24"


def test_below_one_gb_is_refused_not_rendered_as_zero() -> None:
    """0 GB is KVBM's disk tier off: the render is refused (an error of the pool's
    hand-off), naming the directory, its quota and what each instance would get."""
    with pytest.raises(TierOff) as info:
        render("dynamo", ctx(cap=GB // 2))
    assert "DYN_KVBM_DISK_CACHE_GB would switch its disk tier off" in info.value.message
    assert f"/mnt/kv/ns0/dynamo (quota {GB // 2} bytes)" in info.value.message
    assert f"{engine_bytes(GB // 2)} bytes, below 1 GB" in info.value.message
    assert "engines[].capacity" in (info.value.hint or "")


def test_the_issues_second_example_is_refused() -> None:
    """7.68 TB + 20 GB namespaces, five engines (each 18% of a mount), data_parallel 4:
    every file said DYN_KVBM_DISK_CACHE_GB=0 (the 20 GB directory's share), the disk tier
    off everywhere. Now the large directory alone would be 335 GB and the small one is
    named in the refusal."""
    dirs = ("/mnt/kv/ns0/dynamo", "/mnt/kv/ns1/dynamo")
    caps = (1_382_400_000_000, 3_599_958_016)  # quota.mount_caps of 7.68 TB and 20 GB
    with pytest.raises(TierOff) as info:
        render("dynamo", ctx(dirs, cap=sum(caps), directory_caps=caps, data_parallel=4))
    assert "/mnt/kv/ns1/dynamo (quota 3599958016 bytes)" in info.value.message
    assert "/mnt/kv/ns0/dynamo" not in info.value.message
    one = render("dynamo", ctx(dirs[:1], cap=caps[0], data_parallel=4))
    assert parse_env(one.files["dynamo-kvbm.env"])["DYN_KVBM_DISK_CACHE_GB"] == "335"


def test_fallbacks_when_probes_fail() -> None:
    d = "/mnt/kv/ns0/dynamo"
    p = probe("/mnt/kv/ns0", odirect=False, fallocate=False, fallocate_errno=errno.EOPNOTSUPP)
    r = render("dynamo", ctx((d,), probes=(p,)))
    env = parse_env(r.files["dynamo-kvbm.env"])
    assert set(env) == BASE_KEYS | {NO_ODIRECT, ZEROFILL}
    assert env[NO_ODIRECT] == "true" and env[ZEROFILL] == "true"
    assert any(NO_ODIRECT in n and "O_DIRECT open failed" in n for n in r.notes)
    assert any(ZEROFILL in n and f"errno {errno.EOPNOTSUPP}" in n for n in r.notes)


def test_never_writes_switches_when_probes_pass() -> None:
    # KVBM reads these two by presence (std::env::var(..).is_ok()): even "false" switches on.
    env = parse_env(render("dynamo", ctx()).files["dynamo-kvbm.env"])
    assert NO_ODIRECT not in env and ZEROFILL not in env


def test_fallocate_that_reserves_nothing_is_only_noted() -> None:
    p = probe("/mnt/kv/ns0", fallocate=False, fallocate_errno=None)
    r = render("dynamo", ctx(probes=(p,)))
    assert set(parse_env(r.files["dynamo-kvbm.env"])) == BASE_KEYS
    assert any("zero-fills only when fallocate reports EOPNOTSUPP" in n for n in r.notes)


def test_renders_where_gds_is_ready_and_says_so() -> None:
    r = render("dynamo", ctx(gds=READY))
    assert set(parse_env(r.files["dynamo-kvbm.env"])) == BASE_KEYS
    assert any("nvidia-fs loaded" in n and READY.cufile in n for n in r.notes), r.notes


@pytest.mark.parametrize(("gds", "named"), [
    (GdsReadiness(None, None, READY.cufile), ["nvidia-fs kernel module is not loaded"]),
    (GdsReadiness(READY.nvidia_fs_module, None, READY.cufile), ["no device nodes"]),
    (GdsReadiness(READY.nvidia_fs_module, READY.nvidia_fs_devices, None), ["cuFile"]),
    (GdsReadiness(None, None, None), ["nvidia-fs kernel module", "cuFile"]),
])
def test_refuses_without_gds_naming_what_is_missing(gds: GdsReadiness,
                                                    named: list[str]) -> None:
    with pytest.raises(GdsNotReady) as info:
        render("dynamo", ctx(gds=gds))
    err = info.value
    assert not isinstance(err, UsageError)  # the host, not the config: exit 1
    assert "GPUDirect Storage" in err.message and "#6032" in err.message
    for words in named:
        assert words in err.message
    assert "modprobe nvidia-fs" in err.hint and "gds: trust" in err.hint


def test_not_checked_says_so() -> None:
    r = render("dynamo", ctx())
    assert any("not checked (gds: trust)" in n for n in r.notes)
