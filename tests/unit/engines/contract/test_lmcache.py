"""LMCache (lmcache 0.5.6) judges kvagent's ``lmcache.yaml``.

Engine code that runs, through ``agent/engines/checks/check_lmcache.py`` under this
venv's Python (torch CPU) with the pinned wheel's files on PYTHONPATH (no shims):
- imported: ``lmcache.v1.config.LMCacheEngineConfig.from_file`` and
  ``update_config_from_env`` (which calls ``validate``), vLLM's integration's way of
  loading ``LMCACHE_CONFIG_FILE``; the warnings it logs refuse the render;
- loaded from its file: ``lmcache/v1/storage_backend/path_sharder.py`` (``PathSharder``:
  which directory each worker's CUDA device selects); its package's ``__init__`` imports
  every storage backend and needs packages this venv lacks;
- read with ``ast`` and evaluated on the loaded config: ``CreateStorageBackends``'
  condition for making a LocalDiskBackend and ``LocalDiskBackend.__init__``'s
  ``int(config.max_local_disk_size * 1024**3)``; the ``extra_config`` keys LMCache reads.

Renders come from a real apply pass over the fake GPU host and from ``kvagent engines
render``; the negative tests hand the checker deliberately broken renders.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from agent.engines import EngineContext, Rendered, render
from agent.engines.base import GIB, engine_bytes
from agent.engines.quota import project_id

from .kit import GB, AppliedPool, apply_pool, assert_refused, judge_pinned

DIST = "lmcache"
NAME = "lmcache.yaml"


def quotas(applied: AppliedPool) -> dict[str, int]:
    """Each LMCache directory's hard limit, as the apply pass set it (directory -> bytes)."""
    return {f"{m}/lmcache": applied.quota.limits[(m, project_id("lmcache"))]
            for m in applied.mounts}


def assert_facts(applied: AppliedPool, text: str, tp: int, dp: int = 1) -> None:
    """local_disk names the pool's LMCache directories (as _parse_local_disk strips them)
    and the most workers by_gpu sharding can put on one directory, each with LMCache's
    int(size * 1024**3) bytes, fit that directory's quota."""
    caps = quotas(applied)
    data = yaml.safe_load(text)
    paths = [p.removeprefix("file://").rstrip("/") for p in data["local_disk"].split(",")]
    assert paths == list(caps)
    assert all(Path(p).is_dir() for p in paths)
    per_directory = dp * math.ceil(tp / len(paths))
    each = int(data["max_local_disk_size"] * 1024**3)
    assert each > 0
    for cap in caps.values():
        assert per_directory * each <= cap


def accepted(ctx: EngineContext, rendered: Rendered) -> None:
    verdict = judge_pinned(ctx, rendered, DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)
    assert verdict.engine_version == "0.5.6"
    assert "LMCacheEngineConfig.from_file" in verdict.method
    assert "path_sharder" in verdict.method and "ast" in verdict.method


# ------------------------------------------------------------------ accepted

def test_apply_uneven_namespaces_accepted(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported LMCacheEngineConfig.from_file, PathSharder from its file and the ast-read
    size expression accept the apply's file: namespaces of 1 TB and 0.5 TB, one worker
    (device 0 -> the first directory), sized by the smaller directory's quota."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: lmcache"],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    rendered = applied.rendered("lmcache")
    accepted(applied.context("lmcache"), rendered)
    assert_facts(applied, rendered.files[NAME], tp=1)
    small = min(quotas(applied).values())
    size = yaml.safe_load(rendered.files[NAME])["max_local_disk_size"]
    assert size == math.floor(engine_bytes(small) * 100 / GIB) / 100


def test_apply_tensor_parallel_accepted(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same engine code accepts tensor_parallel 4 over 1 TB + 0.5 TB: PathSharder puts
    devices 0,2 on the first directory and 1,3 on the second, two workers each."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: lmcache, tensor_parallel: 4"],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    rendered = applied.rendered("lmcache")
    accepted(applied.context("lmcache"), rendered)
    assert_facts(applied, rendered.files[NAME], tp=4)
    size = yaml.safe_load(rendered.files[NAME])["max_local_disk_size"]
    assert size == math.floor(engine_bytes(min(quotas(applied).values()), 2) * 100 / GIB) / 100


def test_cli_render_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same engine code accepts ``kvagent engines render``'s file (tensor_parallel 2,
    data_parallel 2, uneven namespaces: up to 2 workers per directory)."""
    applied = apply_pool(tmp_path, monkeypatch,
                         ["kind: lmcache, tensor_parallel: 2, data_parallel: 2"],
                         sizes=(1000 * GB, 500 * GB))
    files = applied.cli_render("lmcache")
    assert files == applied.files("lmcache")
    accepted(applied.context("lmcache"), Rendered(files, "yaml"))
    assert_facts(applied, files[NAME], tp=2, dp=2)


def test_one_namespace_tensor_parallel_accepted(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """One directory, tensor_parallel 2: both workers share it (no sharding key)."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: lmcache, tensor_parallel: 2"],
                         sizes=(1000 * GB,))
    rendered = applied.rendered("lmcache")
    assert "local_disk_path_sharding" not in yaml.safe_load(rendered.files[NAME])
    accepted(applied.context("lmcache"), rendered)
    assert_facts(applied, rendered.files[NAME], tp=2)


# ------------------------------------------------------------------ refused

DIRS = ("/mnt/kv/store1-ns1/lmcache", "/mnt/kv/store1-ns2/lmcache")
CAPS = (900 * GB, 450 * GB)


def good() -> tuple[EngineContext, Rendered]:
    ctx = EngineContext("kv", "lmcache", DIRS, sum(CAPS), tensor_parallel=2,
                        directory_caps=CAPS)
    return ctx, render("lmcache", ctx)


def broken(drop: tuple[str, ...] = (), **set_: object) -> tuple[EngineContext, Rendered]:
    """The good render with keys dropped or set."""
    ctx, r = good()
    data = {k: v for k, v in yaml.safe_load(r.files[NAME]).items() if k not in drop} | set_
    return ctx, Rendered({NAME: yaml.safe_dump(data)}, "yaml", r.notes)


def refused(ctx: EngineContext, rendered: Rendered, *words: str) -> None:
    verdict = assert_refused(judge_pinned(ctx, rendered, DIST), *words)
    assert "LMCacheEngineConfig.from_file" in verdict.method


def test_the_good_render_is_accepted() -> None:
    """The base of the negative tests is accepted (so each refusal is the defect's)."""
    accepted(*good())


def test_unknown_key_refused() -> None:
    """LMCache's _resolve_config_aliases logs 'Unknown configuration key' and drops it."""
    refused(*broken(local_disk_size=10.0), "Unknown configuration key: local_disk_size")


def test_missing_local_disk_refused() -> None:
    """Without it LMCache's default is None: CreateStorageBackends makes no disk backend."""
    refused(*broken(drop=("local_disk",)), "required key local_disk is missing")


def test_missing_size_refused() -> None:
    """Without it LMCache's default is 0.0: CreateStorageBackends' condition is false."""
    refused(*broken(drop=("max_local_disk_size",)), "required key max_local_disk_size")


def test_size_in_decimal_gb_with_a_suffix_refused() -> None:
    """'400GB' fails LMCache's float converter: a warning and None."""
    refused(*broken(max_local_disk_size="400GB"), "Failed to convert", "max_local_disk_size")


def test_size_in_bytes_refused() -> None:
    """A byte count read as GiB: far over the quota."""
    refused(*broken(max_local_disk_size=float(400 * GB)), DIRS[1], "exceeds its cap")


def test_even_split_of_the_pool_refused() -> None:
    """The pool split evenly over the directories (675 GB each, in GiB) is over the small
    directory's 450 GB quota."""
    refused(*broken(max_local_disk_size=round(sum(CAPS) / 2 / GIB, 2)), DIRS[1],
            "exceeds its cap")


def test_size_not_divided_among_workers_refused() -> None:
    """tensor_parallel 2 over one directory: both workers land on it, so one directory's
    whole quota per worker is twice too much (PathSharder's own placement)."""
    ctx = EngineContext("kv", "lmcache", DIRS[:1], CAPS[0], tensor_parallel=2)
    text = yaml.safe_dump({"local_disk": f"file://{DIRS[0]}/",
                           "max_local_disk_size": round(CAPS[0] * 0.9 / GIB, 2)})
    refused(ctx, Rendered({NAME: text}, "yaml"), "up to 2 LMCache worker(s)", DIRS[0])


def test_path_outside_the_pool_refused() -> None:
    """PathSharder's all_paths (after _parse_local_disk) include a path outside the pool."""
    refused(*broken(local_disk=f"file://{DIRS[0]}/,file:///var/tmp/lmcache/"),
            "'/var/tmp/lmcache/' is outside the pool's lmcache directories")


def test_unknown_sharding_strategy_refused() -> None:
    """PathSharder raises on anything but by_gpu."""
    refused(*broken(local_disk_path_sharding="round_robin"), "PathSharder refused",
            "round_robin")


def test_unknown_extra_config_key_refused() -> None:
    """No LMCache source reads it (ast): LMCache would ignore it without a word."""
    refused(*broken(extra_config={"use_odirect": True, "use_o_direct": True}),
            "'use_o_direct' is read nowhere in LMCache")


def test_odirect_as_a_string_refused() -> None:
    """'false' is a true value to LocalDiskBackend."""
    refused(*broken(extra_config={"use_odirect": "false"}), "use_odirect", "not a boolean")
