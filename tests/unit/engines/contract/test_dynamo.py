"""NVIDIA Dynamo KVBM (kvbm 1.6.1) judges kvagent's env files.

Engine code that runs, through ``agent/engines/checks/check_dynamo.py`` under this venv's
Python with the pinned wheel's files on PYTHONPATH (no shims): none is executed. KVBM's
configuration lives in its Rust core ``kvbm/_core.abi3.so``, which needs NIXL and CUDA to
load (``import kvbm`` imports ``nixl`` first) and reads its variables only when a leader
and its workers start. The checker reads the binary's strings: every variable kvagent
writes must be one of them, and values are held to how KVBM's code reads them
(``DYN_KVBM_DISK_CACHE_GB`` as f64 decimal GB per instance, ``..._DISABLE_O_DIRECT`` /
``..._ZEROFILL_FALLBACK`` by presence). What this cannot confirm from the binary: the
10^9 multiplier (taken from ai-dynamo/dynamo's leader.rs ``compute_num_blocks``; the
binary's help text only names the unit ``<size_in_gb>``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.engines import EngineContext, Rendered, render
from agent.engines.base import engine_bytes
from agent.engines.quota import project_id
from tests.unit.engines.helpers import parse_env

from .kit import GB, GDS, AppliedPool, apply_pool, assert_refused, judge_pinned

DIST = "kvbm"
DIR = "DYN_KVBM_DISK_CACHE_DIR"
SIZE = "DYN_KVBM_DISK_CACHE_GB"


def quotas(applied: AppliedPool) -> list[int]:
    return [applied.quota.limits[(m, project_id("dynamo"))] for m in applied.mounts]


def assert_facts(applied: AppliedPool, files: dict[str, str], instances: int) -> None:
    """Each file names one of the pool's KVBM directories, and its size is that
    directory's own quota less headroom, split among the instances sharing it, in whole
    decimal GB (the issue's defect: every file sized by the smallest directory)."""
    dirs = [f"{m}/dynamo" for m in applied.mounts]
    cap = dict(zip(dirs, quotas(applied), strict=True))
    envs = [parse_env(t) for t in files.values()]
    assert sorted(e[DIR] for e in envs) == sorted(dirs)
    for env in envs:
        assert int(env[SIZE]) == engine_bytes(cap[env[DIR]], instances) // GB > 0
        assert int(env[SIZE]) * GB * instances <= cap[env[DIR]]
    assert len({e[SIZE] for e in envs}) == 2  # 1 TB and 0.5 TB: two sizes


def test_apply_uneven_namespaces_tensor_parallel_accepted(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """kvbm/_core.abi3.so's strings and KVBM's value rules accept the apply's files: 1 TB
    and 0.5 TB namespaces, tensor_parallel 2 (the leader sums its TP workers' bytes per
    block, so the size is the instance's, not split by TP)."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: dynamo, tensor_parallel: 2"],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    rendered = applied.rendered("dynamo")
    verdict = judge_pinned(applied.context("dynamo"), rendered, DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)
    assert verdict.engine_version == "1.6.1"
    assert "strings of kvbm/_core.abi3.so" in verdict.method
    assert "names the unit <size_in_gb>" in verdict.method
    assert_facts(applied, applied.files("dynamo"), instances=1)


def test_cli_render_data_parallel_accepted(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check accepts ``kvagent engines render``'s files; two instances per
    directory split its quota (gds: trust: the CLI looks at this host's GDS)."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: dynamo, data_parallel: 2, gds: trust"],
                         sizes=(1000 * GB, 500 * GB))
    files = applied.cli_render("dynamo")
    assert files == applied.files("dynamo")
    verdict = judge_pinned(applied.context("dynamo"), Rendered(files, "env"), DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)
    assert_facts(applied, files, instances=2)


# ------------------------------------------------------------------ refused

DIRS = ("/mnt/kv/store1-ns1/dynamo", "/mnt/kv/store1-ns2/dynamo")
CAPS = (900 * GB, 450 * GB)
FILE = "dynamo-kvbm-1.env"


def good() -> tuple[EngineContext, Rendered]:
    ctx = EngineContext("kv", "dynamo", DIRS, sum(CAPS), gds=GDS, directory_caps=CAPS)
    return ctx, render("dynamo", ctx)


def broken(drop: tuple[str, ...] = (), **set_: str) -> tuple[EngineContext, Rendered]:
    """The good render with the second file's variables changed."""
    ctx, r = good()
    env = {k: v for k, v in parse_env(r.files[FILE]).items() if k not in drop} | set_
    files = dict(r.files) | {FILE: "".join(f"{k}={v}\n" for k, v in env.items())}
    return ctx, Rendered(files, "env", r.notes)


def refused(ctx: EngineContext, rendered: Rendered, *words: str) -> None:
    assert_refused(judge_pinned(ctx, rendered, DIST), *words)


def test_the_good_render_is_accepted() -> None:
    verdict = judge_pinned(*good(), DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)


def test_unknown_variable_refused() -> None:
    """A plausible name that is not in the binary."""
    refused(*broken(DYN_KVBM_DISK_CACHE_SIZE_GB="10"),
            "unknown variable DYN_KVBM_DISK_CACHE_SIZE_GB")


def test_prefix_of_a_real_name_is_unknown() -> None:
    """Packed Rust strings: DYN_KVBM_DISK_CACHE is only the start of real names."""
    refused(*broken(DYN_KVBM_DISK_CACHE="1"), "unknown variable DYN_KVBM_DISK_CACHE:")


def test_missing_size_refused() -> None:
    refused(*broken(drop=(SIZE,)), "missing required variable", SIZE)


@pytest.mark.parametrize("value", ["400GiB", "4e2", "400.5"])
def test_size_not_whole_gb_refused(value: str) -> None:
    """KVBM's parse::<f64>() reads '400GiB' as 0 (disk tier off); older KVBM parsed an
    integer, so '4e2' and '400.5' are refused too."""
    refused(*broken(**{SIZE: value}), SIZE, "not a whole number of GB")


def test_size_in_bytes_refused() -> None:
    """Bytes where KVBM reads decimal GB."""
    refused(*broken(**{SIZE: str(400 * GB)}), SIZE, "more than its quota")


def test_each_file_is_held_to_its_own_directory() -> None:
    """KVBM preallocates the whole size in the directory its file names: the good render
    gives the 900 GB directory 873 GB (accepted above); the same 873 GB in the 450 GB
    directory's file is refused against that directory's quota."""
    _, r = good()
    sizes = [parse_env(t)[SIZE] for t in r.files.values()]
    assert sizes == ["873", "436"]
    refused(*broken(**{SIZE: "873"}), FILE, "more than its quota", str(CAPS[1]))


def test_path_outside_the_pool_refused() -> None:
    refused(*broken(**{DIR: "/tmp/"}), "outside the pool's engine directories")


@pytest.mark.parametrize("value", ["false", "0"])
def test_presence_switch_written_false_refused(value: str) -> None:
    """KVBM checks only that it is set: 'false' switches O_DIRECT off."""
    refused(*broken(DYN_KVBM_DISK_DISABLE_O_DIRECT=value),
            "DYN_KVBM_DISK_DISABLE_O_DIRECT", "switches it ON")
