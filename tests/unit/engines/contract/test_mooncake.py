"""Mooncake store (mooncake-transfer-engine 0.3.13.post1) judges kvagent's env files.

Engine code that runs, through ``agent/engines/checks/check_mooncake.py`` under this
venv's Python with the pinned wheel's files on PYTHONPATH (no shims):
- imported: ``mooncake.mooncake_config`` (pure Python), whose
  ``MooncakeConfig.load_from_env`` reads each env file's environment
  (``MOONCAKE_OFFLOAD_ENABLED`` -> ``enable_ssd_offload`` through its ``_parse_bool``,
  ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`` -> ``ssd_offload_path``);
- read, not run: the native store ``mooncake/store.so`` (it needs libcuda.so.1 to load):
  the ``MOONCAKE_*``/``MC_*`` names in its strings are the variables the native
  ``FileStorageConfig``/``BucketBackendConfig::FromEnvironment`` read; values are held to
  how that code parses them (int64 bytes, fifo/lru, ``ValidatePath``).

Renders come from a real apply pass over the fake GPU host and from ``kvagent engines
render``; the negative tests hand the checker deliberately broken renders.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.engines import EngineContext, Rendered, render
from agent.engines.base import engine_bytes
from agent.engines.quota import project_id
from tests.unit.engines.helpers import parse_env

from .kit import GB, AppliedPool, apply_pool, assert_refused, judge_pinned

DIST = "mooncake-transfer-engine"
PATH = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
TOTAL = "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"
BUCKET = "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE"


def quotas(applied: AppliedPool) -> dict[str, int]:
    """Each Mooncake directory's hard limit, as the apply pass set it (mount -> bytes)."""
    return {f"{m}/mooncake": applied.quota.limits[(m, project_id("mooncake"))]
            for m in applied.mounts}


def assert_facts(applied: AppliedPool, files: dict[str, str], ranks: int) -> None:
    """Every client's path is its own directory in the pool, made by the apply, and its
    sizes (bytes, as Mooncake reads them) fit the quota divided among the ranks."""
    caps = quotas(applied)
    paths = []
    for text in files.values():
        env = parse_env(text)
        path = env[PATH]
        directory = next(d for d in caps if path == d or path.startswith(d + "/"))
        assert Path(path).is_dir(), f"{path} was not made by the apply"
        for key in (TOTAL, BUCKET):
            assert 0 < int(env[key]) <= caps[directory] // ranks
        paths.append(path)
    assert len(set(paths)) == len(paths) == len(caps) * ranks


def on_disk_subdirectories(ctx: EngineContext) -> tuple[str, ...]:
    """The directories the apply made inside the engine's own."""
    return tuple(sorted(str(p) for d in ctx.directories for p in Path(d).iterdir()
                        if p.is_dir()))


# ------------------------------------------------------------------ accepted

def test_apply_uneven_namespaces_tensor_parallel_accepted(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Imported mooncake_config.load_from_env + store.so's strings accept the apply's
    files: two namespaces of 1 TB and 0.5 TB, tensor_parallel 2 (one client and one
    subdirectory per rank per directory)."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: mooncake, tensor_parallel: 2"],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    rendered = applied.rendered("mooncake")
    verdict = judge_pinned(applied.context("mooncake"), rendered, DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)
    assert verdict.engine_version == "0.3.13.post1"
    assert "load_from_env" in verdict.method and "store.so" in verdict.method
    assert sorted(rendered.files) == ["mooncake-0-rank0.env", "mooncake-0-rank1.env",
                                      "mooncake-1-rank0.env", "mooncake-1-rank1.env"]
    assert_facts(applied, applied.files("mooncake"), ranks=2)
    caps = quotas(applied)
    small = parse_env(rendered.files["mooncake-1-rank0.env"])
    assert int(small[TOTAL]) == engine_bytes(caps[f"{applied.mounts[1]}/mooncake"], 2)


def test_cli_render_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same engine code accepts ``kvagent engines render``'s files (data_parallel 2,
    uneven namespaces), with the subdirectories the apply made on disk."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: mooncake, data_parallel: 2"],
                         sizes=(1000 * GB, 500 * GB))
    ctx = applied.context("mooncake")
    files = applied.cli_render("mooncake")
    assert files == applied.files("mooncake")
    verdict = judge_pinned(ctx, Rendered(files, "env", (), on_disk_subdirectories(ctx)), DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)
    assert_facts(applied, files, ranks=2)


def test_one_rank_uses_the_directory_itself(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """One client per directory needs no subdirectory; load_from_env reads it."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: mooncake"], sizes=(1000 * GB,))
    rendered = applied.rendered("mooncake")
    assert rendered.subdirectories == () and list(rendered.files) == ["mooncake.env"]
    verdict = judge_pinned(applied.context("mooncake"), rendered, DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)
    assert_facts(applied, rendered.files, ranks=1)


# ------------------------------------------------------------------ refused

DIRS = ("/mnt/kv/store1-ns1/mooncake", "/mnt/kv/store1-ns2/mooncake")
CAPS = (900 * GB, 450 * GB)


def good() -> tuple[EngineContext, Rendered]:
    ctx = EngineContext("kv", "mooncake", DIRS, sum(CAPS), tensor_parallel=2,
                        directory_caps=CAPS)
    return ctx, render("mooncake", ctx)


def broken(name: str, drop: tuple[str, ...] = (), **set_: str) -> tuple[EngineContext, Rendered]:
    """The good render with one file's variables changed."""
    ctx, r = good()
    env = {k: v for k, v in parse_env(r.files[name]).items() if k not in drop} | set_
    files = dict(r.files) | {name: "".join(f"{k}={v}\n" for k, v in env.items())}
    return ctx, Rendered(files, "env", r.notes, r.subdirectories)


def refused(ctx: EngineContext, rendered: Rendered, *words: str) -> None:
    assert_refused(judge_pinned(ctx, rendered, DIST), *words)


def test_the_good_render_is_accepted() -> None:
    """The base of the negative tests is accepted (so each refusal is the defect's)."""
    verdict = judge_pinned(*good(), DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)


def test_unknown_variable_refused() -> None:
    """A name neither mooncake_config.py nor store.so reads (a near miss of a real one)."""
    refused(*broken("mooncake-0-rank0.env", MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT="1"),
            "unknown variable MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT")


def test_missing_storage_path_refused() -> None:
    refused(*broken("mooncake-1-rank1.env", drop=(PATH,)), "missing required variable", PATH)


def test_missing_bucket_threshold_refused() -> None:
    """Without it Mooncake evicts only at 90% of the filesystem."""
    refused(*broken("mooncake-0-rank1.env",
                    drop=(BUCKET, "MOONCAKE_BUCKET_MAX_TOTAL_SIZE")),
            "missing required variable", BUCKET)


@pytest.mark.parametrize("value", ["400GB", "4.0e11"])
def test_size_not_in_bytes_refused(value: str) -> None:
    """Mooncake reads int64 bytes; '400GB' would be a warning and its 2 TB default."""
    refused(*broken("mooncake-0-rank0.env", **{TOTAL: value}), TOTAL, "not whole bytes")


def test_size_over_the_quota_per_rank_refused() -> None:
    """An even split of the pool per directory (675 GB) is over the small directory's
    quota (450 GB) divided between its two ranks."""
    even = str(sum(CAPS) // 2 // 2)
    refused(*broken("mooncake-1-rank0.env", **{TOTAL: even, BUCKET: even,
                                               "MOONCAKE_BUCKET_MAX_TOTAL_SIZE": even}),
            "mooncake-1-rank0.env", "exceeds the quota", DIRS[1])


def test_path_outside_the_pool_refused() -> None:
    refused(*broken("mooncake-0-rank0.env", **{PATH: "/var/tmp/mooncake"}),
            "outside the pool's engine directories")


def test_two_ranks_sharing_one_directory_refused() -> None:
    """Both ranks told the engine directory itself: their bucket backends collide."""
    ctx, r = good()
    files = dict(r.files)
    for name in ("mooncake-0-rank0.env", "mooncake-0-rank1.env"):
        env = parse_env(files[name]) | {PATH: DIRS[0]}
        files[name] = "".join(f"{k}={v}\n" for k, v in env.items())
    refused(ctx, Rendered(files, "env", (), r.subdirectories), "share storage", DIRS[0])


def test_eviction_policy_mooncake_does_not_know_refused() -> None:
    """'LRU' is not 'lru': Mooncake silently turns eviction off."""
    refused(*broken("mooncake-0-rank0.env", MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY="LRU"),
            "not fifo or lru")


def test_enabled_value_load_from_env_rejects_refused() -> None:
    """MooncakeConfig.load_from_env's _parse_bool raises on it: the engine's own words."""
    ctx, r = broken("mooncake-1-rank0.env", MOONCAKE_OFFLOAD_ENABLED="enabled")
    verdict = judge_pinned(ctx, r, DIST)
    assert verdict.verdict == "refused"
    assert any("load_from_env refused it" in p and "Invalid boolean" in p
               for p in verdict.problems), verdict.problems
