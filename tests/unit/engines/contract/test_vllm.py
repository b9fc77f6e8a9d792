"""vLLM 0.33.0 judges kvagent's ``--kv-transfer-config`` files with its own code.

Engine code that runs, through ``agent/engines/checks/check_vllm.py`` under this venv's
Python with the pinned wheel's files on PYTHONPATH (no shims):
- imported by their normal names: ``vllm.config.kv_transfer`` (KVTransferConfig),
  ``vllm.engine.arg_utils`` (``_expand_json_human_readable_numbers``: each file is parsed
  as ``vllm serve --kv-transfer-config`` parses it, then pydantic's
  ``TypeAdapter(KVTransferConfig).validate_json``), ``vllm.distributed.kv_transfer.
  kv_connector.factory`` (the connector registry);
- for the fs tier (``cpu_cache``): ``vllm.v1.kv_offload.factory``
  (``OffloadingSpecFactory.create_spec`` builds TieringOffloadingSpec, a CPUOffloadingSpec,
  from an ``OffloadingConfig`` for a small model at the pool's tensor-parallel size) and
  ``vllm.v1.kv_offload.tiering.factory`` (``get_tier_class``: each tier's keys are bound to
  FileSystemTierManager's signature; the tier is not constructed, it would write);
- for the disk backend (no ``cpu_cache``): ``KVConnectorFactory.create_connector`` builds
  SimpleCPUOffloadConnector in the worker role (its own validation of
  ``kv_offload_backend``, ``disk_path``, ``disk_capacity_bytes``), then per rank the
  worker's ``_resolve_num_cpu_blocks`` and ``_init_disk_mode`` name and size the file
  vLLM would open (its DiskBackend, which pins memory and writes, replaced by a recorder);
- read with ``ast``: each connector's modules, for the ``kv_connector_extra_config`` keys
  vLLM reads (it ignores others silently).
vLLM's pure-Python dependencies are installed in the venv; its compiled ops (``vllm._C``)
are not, which vLLM tolerates with a warning at import (reported, not held against a render).

Renders come from a real apply pass over the fake GPU host and from ``kvagent engines
render``; the negative tests hand the checker deliberately broken renders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.engines import EngineContext, Rendered, render
from agent.engines.base import engine_bytes

from .kit import GB, AppliedPool, apply_pool, assert_refused, judge_pinned, wheel_files

DIST = "vllm"
GIB = 1024**3
TIER = ("vllm.v1.kv_offload.tiering.spec", "vllm.v1.kv_offload.tiering.fs.manager",
        "vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector")


@pytest.fixture(scope="module", autouse=True)
def compiled_wheel() -> None:
    """Byte-compile the modules the checker imports, once: the checker runs with
    PYTHONDONTWRITEBYTECODE, and compiling vLLM's sources on every run doubles its time."""
    wheel = wheel_files(DIST)
    if (wheel / "vllm/v1/kv_offload/tiering/fs/__pycache__").is_dir():
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(wheel)
    imports = ", ".join(("vllm.config.kv_transfer", "vllm.engine.arg_utils",
                         "vllm.distributed.kv_transfer.kv_connector.factory", *TIER))
    subprocess.run([sys.executable, "-c", f"import {imports}"], env=env, capture_output=True,
                   check=True, timeout=300)


def extra_configs(files: dict[str, str]) -> list[dict]:
    return [json.loads(text)["kv_connector_extra_config"] for text in files.values()]


def assert_facts(applied: AppliedPool, ctx: EngineContext, files: dict[str, str]) -> None:
    """One file per directory, its fs tier that directory (made by the apply); the CPU tier
    is the config's cpu_cache in bytes; nothing sized on disk (vLLM's fs tier has no size
    setting: the quota is its only bound)."""
    roots = []
    for extra in extra_configs(files):
        assert extra["cpu_bytes_to_use"] == 32 * GIB
        (tier,) = extra["secondary_tiers"]
        assert set(tier) == {"type", "root_dir"} and tier["type"] == "fs"
        assert Path(tier["root_dir"]).is_dir()
        roots.append(tier["root_dir"])
    assert roots == list(ctx.directories) == [f"{m}/vllm" for m in applied.mounts]


def assert_accepted(ctx: EngineContext, rendered: Rendered, tp: int) -> None:
    verdict = judge_pinned(ctx, rendered, DIST)
    assert verdict.verdict == "accepted", (verdict.problems, verdict.messages)
    assert verdict.engine_version == "0.33.0"
    assert verdict.method.startswith("imported vllm 0.33.0")
    assert "create_spec" in verdict.method and f"tensor_parallel={tp}" in verdict.method


# ------------------------------------------------------------------ accepted

def test_apply_uneven_namespaces_accepted(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported KVTransferConfig, the connector registry, OffloadingSpecFactory.create_spec
    and the fs tier's signature accept the apply's files: namespaces of 1 TB and 0.5 TB."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: vllm, cpu_cache: 32GiB"],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    ctx = applied.context("vllm")
    assert ctx.caps()[0] > ctx.caps()[1]
    rendered = applied.rendered("vllm")
    assert_facts(applied, ctx, dict(rendered.files))
    assert_accepted(ctx, rendered, tp=1)


def test_cli_render_tensor_parallel_accepted(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The same vLLM code accepts ``kvagent engines render``'s files for tensor_parallel 4
    and data_parallel 2 (the spec built for four workers)."""
    applied = apply_pool(tmp_path, monkeypatch,
                         ["kind: vllm, cpu_cache: 32GiB, tensor_parallel: 4, data_parallel: 2"],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    files = applied.cli_render("vllm")
    assert files == applied.files("vllm")
    ctx = applied.context("vllm")
    assert (ctx.tensor_parallel, ctx.data_parallel) == (4, 2)
    assert_facts(applied, ctx, files)
    assert_accepted(ctx, Rendered(files, "json"), tp=4)


def test_apply_disk_backend_uneven_namespaces_tp4_dp2_accepted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without cpu_cache: vLLM's factory builds SimpleCPUOffloadConnector from each of the
    apply's files (1 TB and 0.5 TB namespaces, tensor_parallel 4 x data_parallel 2: a
    file per directory and replica), and its worker code names and sizes every rank's
    file inside that directory, all of them within its quota. ``kvagent engines render``
    gives the same files."""
    applied = apply_pool(tmp_path, monkeypatch,
                         ["kind: vllm, tensor_parallel: 4, data_parallel: 2"],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    ctx = applied.context("vllm")
    rendered = applied.rendered("vllm")
    assert applied.cli_render("vllm") == dict(rendered.files)
    assert len(rendered.files) == 4
    caps = dict(zip(ctx.directories, ctx.caps(), strict=True))
    for text in rendered.files.values():
        data = json.loads(text)
        assert data["kv_connector"] == "SimpleCPUOffloadConnector"
        extra = data["kv_connector_extra_config"]
        directory = os.path.dirname(extra["disk_path"])
        assert extra["disk_capacity_bytes"] == engine_bytes(caps[directory], 8)
    assert_accepted(ctx, rendered, tp=4)


# ------------------------------------------------------------------ refused

def broken_render(directory: str) -> dict[str, str]:
    """Files broken one way each (and one good one), for a pool whose directory is
    ``directory``."""
    def config(extra: dict, tier: dict | None = None) -> str:
        base = {"cpu_bytes_to_use": 32 * GIB, "spec_name": "TieringOffloadingSpec",
                "secondary_tiers": [tier or {"type": "fs", "root_dir": directory}]}
        return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {**base, **extra}})

    missing = json.loads(config({}))
    del missing["kv_connector_extra_config"]["cpu_bytes_to_use"]
    return {
        "good.json": config({}),
        "unknown-key.json": config({"disk_bytes_to_use": 10**12}),
        "unknown-tier-key.json": config({}, {"type": "fs", "root_dir": directory,
                                             "max_bytes": 10**12}),
        "missing-key.json": json.dumps(missing),
        "wrong-unit.json": config({"cpu_bytes_to_use": 32}),
        "unit-string.json": config({"cpu_bytes_to_use": "32GiB"}),
        "outside.json": config({}, {"type": "fs", "root_dir": "/var/tmp/vllm"}),
    }


def test_broken_renders_refused(tmp_path: Path) -> None:
    """Imported vLLM refuses each broken file with a problem naming what is wrong: an
    unknown extra-config key (ast: no vLLM code reads it), an unknown fs-tier key
    (FileSystemTierManager's signature), cpu_bytes_to_use missing (CPUOffloadingSpec's own
    exception), in the wrong unit (32 holds no chunk; "32GiB" fails vLLM's int()), a
    root_dir outside the pool. The good file in the same render draws no problem."""
    directory = str(tmp_path / "mnt/kv/store1-ns1/vllm")
    ctx = EngineContext("kv", "vllm", (directory,), 10**12, directory_caps=(10**12,),
                        cpu_bytes=32 * GIB)
    verdict = judge_pinned(ctx, Rendered(broken_render(directory), "json"), DIST)
    assert verdict.verdict == "refused" and verdict.engine_version == "0.33.0"

    def problems(name: str) -> str:
        return " | ".join(p for p in verdict.problems if p.startswith(f"{name}:"))

    assert problems("good.json") == ""
    assert "unknown key kv_connector_extra_config.disk_bytes_to_use" in problems(
        "unknown-key.json")
    assert "unknown key 'max_bytes'" in problems("unknown-tier-key.json")
    assert "cpu_bytes_to_use must be specified" in problems("missing-key.json")
    assert "cpu_bytes_to_use=32 holds no chunk" in problems("wrong-unit.json")
    assert "'32GiB'" in problems("unit-string.json")
    assert "root_dir '/var/tmp/vllm' is outside" in problems("outside.json")
    assert any("cpu_bytes_to_use must be specified" in m for m in verdict.messages)


def test_top_level_unknown_key_and_no_connector_refused(tmp_path: Path) -> None:
    """vLLM's own parser (pydantic, extra fields forbidden) refuses an unknown top-level
    key; a file without kv_connector, which vLLM takes, is refused for offloading nothing."""
    directory = str(tmp_path / "vllm")
    good = json.loads(broken_render(directory)["good.json"])
    files = {"top.json": json.dumps({**good, "kv_cache_bytes": 1}),
             "none.json": json.dumps({"kv_connector_extra_config":
                                      good["kv_connector_extra_config"]})}
    ctx = EngineContext("kv", "vllm", (directory,), 10**12, cpu_bytes=32 * GIB)
    verdict = judge_pinned(ctx, Rendered(files, "json"), DIST)
    assert verdict.verdict == "refused"
    assert any(p.startswith("top.json:") and "kv_cache_bytes: Unexpected keyword argument" in p
               for p in verdict.problems), verdict.problems
    assert any(p.startswith("none.json: kv_connector is missing") for p in verdict.problems)


def test_without_vllm_the_verdict_is_unavailable(tmp_path: Path) -> None:
    """Under a Python without vLLM (this venv, no wheel on the path) the checker says the
    engine's code is unavailable instead of judging."""
    from agent.engines.verdict import judge

    directory = str(tmp_path / "vllm")
    ctx = EngineContext("kv", "vllm", (directory,), 10**12, cpu_bytes=32 * GIB)
    env_path = os.environ.get("PYTHONPATH")
    assert env_path is None or "vllm" not in env_path
    verdict = judge(ctx, Rendered(broken_render(directory), "json"), sys.executable)
    assert verdict.verdict == "unavailable", (verdict.problems, verdict.messages)
    assert any("importing vllm" in m and "vllm" in m for m in verdict.messages)


def broken_disk_render(directory: str) -> dict[str, str]:
    """Disk-backend files broken one way each (and one good one), for one directory."""
    def config(**extra: object) -> str:
        base = {"kv_offload_backend": "disk", "disk_path": f"{directory}/kv-offload",
                "disk_capacity_bytes": GIB}
        return json.dumps({"kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {
                               k: v for k, v in {**base, **extra}.items() if v is not None}})

    return {
        "good.json": config(),
        "no-path.json": config(disk_path=None),
        "zero.json": config(disk_path=f"{directory}/z", disk_capacity_bytes=0),
        "cpu.json": config(disk_path=f"{directory}/c", kv_offload_backend="cpu"),
        "nvme.json": config(disk_path=f"{directory}/n", kv_offload_backend="nvme"),
        "unknown-key.json": config(disk_path=f"{directory}/u", disk_bytes=GIB),
        "outside.json": config(disk_path="/var/tmp/kv-offload"),
        "the-directory.json": config(disk_path=directory),
        "same-path.json": config(),
        "too-big.json": config(disk_path=f"{directory}/b", disk_capacity_bytes=10**12),
        "page-cache-string.json": config(disk_path=f"{directory}/p", use_page_cache="false"),
    }


def test_broken_disk_backend_renders_refused(tmp_path: Path) -> None:
    """vLLM's SimpleCPUOffloadConnector and its worker code refuse each broken file with a
    problem naming it: no disk_path and a capacity of 0 (its own ValueErrors), an unknown
    backend (its ValueError), the cpu backend (its warning "ignoring disk-only config":
    nothing reaches the pool), an unknown key (ast), a file outside the pool, disk_path
    the directory itself (the worker's file is <dir>.rank_0, beside it), two files on one
    path (vLLM unlinks the name at start), a capacity past the directory's quota,
    use_page_cache as a string. The good file draws no problem."""
    directory = str(tmp_path / "mnt/kv/store1-ns1/vllm")
    cap = 100 * GIB
    ctx = EngineContext("kv", "vllm", (directory,), cap, directory_caps=(cap,))
    verdict = judge_pinned(ctx, Rendered(broken_disk_render(directory), "json"), DIST)
    assert verdict.verdict == "refused" and verdict.engine_version == "0.33.0"

    def problems(name: str) -> str:
        return " | ".join(p for p in verdict.problems if p.startswith(f"{name}:"))

    assert problems("good.json") == ""
    assert "requires disk_path to be set" in problems("no-path.json")
    assert "requires disk_capacity_bytes > 0" in problems("zero.json")
    assert "ignoring disk-only config" in problems("cpu.json")
    assert "keeps blocks in host RAM" in problems("cpu.json")
    assert "Unknown kv_offload_backend 'nvme'" in problems("nvme.json")
    assert "unknown key kv_connector_extra_config.disk_bytes" in problems("unknown-key.json")
    assert "opens /var/tmp/kv-offload.rank_0, outside the pool" in problems("outside.json")
    assert f"opens {directory}.rank_0, outside the pool" in problems("the-directory.json")
    assert "as does good.json's worker on cuda:0" in problems("same-path.json")
    assert "more than the quota of" in problems("too-big.json")
    assert "use_page_cache='false' is not a bool" in problems("page-cache-string.json")


def test_a_disk_render_for_the_wrong_worker_count_refused(tmp_path: Path) -> None:
    """The render for one worker per directory, judged for tensor_parallel 4: four workers
    each fill what the directory had for one, past its quota."""
    directory = str(tmp_path / "mnt/kv/store1-ns1/vllm")
    one = EngineContext("kv", "vllm", (directory,), 100 * GIB, directory_caps=(100 * GIB,))
    four = EngineContext("kv", "vllm", (directory,), 100 * GIB, directory_caps=(100 * GIB,),
                         tensor_parallel=4)
    assert_refused(judge_pinned(four, render("vllm", one), DIST),
                   "the disk backend's files in", "more than its quota")


def test_a_quota_below_one_block_is_refused_by_the_workers_own_sizing(tmp_path: Path) -> None:
    """kvagent's render for a 1 MiB directory tells the worker 1,017,118 bytes; vLLM's
    worker still makes one block (2 MiB for this model at tensor_parallel 1), past the
    quota: kvagent cannot know a model's block size, vLLM's own sizing shows it."""
    directory = str(tmp_path / "mnt/kv/store1-ns1/vllm")
    ctx = EngineContext("kv", "vllm", (directory,), 1 << 20, directory_caps=(1 << 20,))
    rendered = render("vllm", ctx)
    extra = json.loads(rendered.files["vllm-kv-transfer-config.json"])[
        "kv_connector_extra_config"]
    assert extra["disk_capacity_bytes"] == engine_bytes(1 << 20) == 1_017_118
    assert_refused(judge_pinned(ctx, rendered, DIST), "may fill 2097152 bytes",
                   "more than the quota of")
