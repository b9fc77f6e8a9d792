"""The hand-off sizes what it does for each directory from that directory's own cap.

Through a real apply pass over the fake GPU host (contract/kit.apply_pool): a render
that would switch an engine's disk tier off is an error of the pool (the other engines
are handed off, an old render of the refused engine removed), and the cleaner, where a
directory's project has no hard limit to read, measures usage against that directory's
own cap, not an even split of the pool.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.config.model import EngineConfig
from agent.engines.quota import mount_caps, project_id
from tests.unit.engines.fakequota import FakeQuota

from .contract.kit import GB, apply_pool

KIB64 = 65536
ALL = ("kind: dynamo, gds: trust{dp}", "kind: lmcache", "kind: vllm, cpu_cache: 8GiB",
       "kind: sglang", "kind: mooncake")


def test_a_tier_switched_off_is_an_error_of_the_pool(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's second example: namespaces of 7.68 TB and 20 GB, five engines (18% of
    each mount each), Dynamo with data_parallel 4. The 20 GB directory's share is 0.87 GB
    per KVBM instance: before, both files said DYN_KVBM_DISK_CACHE_GB=0 and the apply
    reported success with a note; now the apply reports the pool's error naming that
    directory, removes the old dynamo render and hands the other four engines off."""
    old = tmp_path / "state/engines/kv/dynamo/dynamo-kvbm-0.env"
    old.parent.mkdir(parents=True)
    old.write_text("DYN_KVBM_DISK_CACHE_GB=1\n")
    engines = [e.format(dp=", data_parallel: 4") for e in ALL]
    applied = apply_pool(tmp_path, monkeypatch, engines, sizes=(7680 * GB, 20 * GB))
    (err,) = applied.result.errors
    assert err.pool == "kv"
    assert "not rendering dynamo: DYN_KVBM_DISK_CACHE_GB would switch its disk tier off" in (
        err.message)
    assert f"{applied.mounts[1]}/dynamo (quota" in err.message
    assert f"{applied.mounts[0]}/dynamo" not in err.message
    assert "engines[].capacity" in (err.hint or "")
    assert applied.files("dynamo") == {} and not old.parent.exists()
    for kind in ("lmcache", "vllm", "sglang", "mooncake"):
        assert applied.files(kind), kind
    # kvagent engines render: exit 1, the same words, no traceback, no files.
    config = applied.state.parent / "kvagent.yaml"
    config.write_text(applied.host.config_text(applied._initiator))
    res = CliRunner().invoke(main, ["-c", str(config), "engines", "render", "kv",
                                    "--engine", "dynamo"])
    assert res.exit_code == 1, res.output
    assert "DYN_KVBM_DISK_CACHE_GB would switch its disk tier off" in res.output
    assert "Traceback" not in res.output and "DYN_KVBM_DISK_CACHE_DIR" not in res.output


def test_the_issues_first_example_gives_each_directory_its_own_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 TB + 0.5 TB, five engines: the 1 TB directory's KVBM got 87 of its 180 GB (the
    0.5 TB directory's share); now 174 GB, and the 0.5 TB one 87."""
    applied = apply_pool(tmp_path, monkeypatch, [e.format(dp="") for e in ALL],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    files = applied.files("dynamo")
    assert [line for text in files.values() for line in text.splitlines()
            if line.startswith("DYN_KVBM_DISK_CACHE_GB=")] == [
        "DYN_KVBM_DISK_CACHE_GB=174", "DYN_KVBM_DISK_CACHE_GB=87"]


class NoLimits(FakeQuota):
    """Project quotas that account usage but refuse limits (EPERM, as quotactl under a
    seccomp filter without it): the apply reports the cap as not set and the first
    directory stays in its project without a hard limit, so the cleaner has no limit to
    read there and falls back to the directory's computed cap."""

    def set_limit(self, mount: str, projid: int, hard_bytes: int) -> None:
        self.calls.append(("set_limit", mount, str(projid), str(hard_bytes)))
        raise PermissionError(errno.EPERM, "Operation not permitted")


def write(directory: Path, count: int) -> None:
    for i in range(count):
        path = directory / f"block-{i}.bin"
        path.write_bytes(b"k" * KIB64)
        os.utime(path, ns=(10**18 + i * 10**9,) * 2)


BIG, SMALL = 1_000_000, 200_000


@pytest.mark.parametrize(("sizes", "files", "cleaned"), [
    ((BIG, SMALL), 6, False),  # 6 x 64 KiB: 46% of its 851,968; 73% of the even 540,000
    ((SMALL, BIG), 2, True),  # 2 x 64 KiB: 100% of its 131,072; 24% of the even 540,000
])
def test_the_cleaners_fallback_is_each_directorys_own_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: tuple[int, int], files: int,
        cleaned: bool) -> None:
    """Namespaces of 1,000,000 and 200,000 bytes: vLLM's directory caps are 851,968 and
    131,072 bytes (90%, in 64 KiB); the pool's cap is 1,080,000, 540,000 per mount when
    split evenly (the old fallback). With no hard limit to read, the cleaner (high 50%,
    low 25%) must measure the first directory against its own cap: the large one at 46%
    is left alone (the old fallback cleaned it), the small one at 100% is brought down
    (the old fallback left it full)."""
    engines = ["kind: vllm, cpu_cache: 1GiB, cleaner: {enabled: true, high: 50%, low: 25%}"]
    quota = NoLimits()
    applied = apply_pool(tmp_path, monkeypatch, engines, sizes=sizes, quota=quota)
    assert any("Operation not permitted" in e.message for e in applied.result.errors)
    own = mount_caps(sizes[0], [EngineConfig(kind="vllm")])["vllm"]
    assert own == {BIG: 851_968, SMALL: 131_072}[sizes[0]]
    first = Path(applied.mounts[0]) / "vllm"
    write(first, files)
    usage = quota.get(applied.mounts[0], project_id("vllm"))
    assert (usage.used_bytes, usage.hard_limit_bytes) == (files * KIB64, 0)
    runs = [a for a in applied.apply().actions if a.kind == "engine.clean"]
    if not cleaned:
        assert runs == [] and len(list(first.iterdir())) == files
        return
    assert [a.subject for a in runs] == [str(first)]
    assert f"of cap {own}" in runs[0].detail
    assert list(first.iterdir()) == []  # 25% of 131,072 is under one 64 KiB file
