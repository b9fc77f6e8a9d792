"""SGLang 0.5.23 (pinned) judges what kvagent renders for it, both storage backends.

Which engine code runs (``agent/engines/checks/check_sglang.py``, under this venv's Python
with the pinned wheel's files on PYTHONPATH, then ``shims/sglang``: an empty ``triton``,
which ``sglang/srt/utils/common.py`` imports at module level):

- imported from the wheel (``sglang`` registered as a bare package, so its
  ``__init__`` and the runtime it imports do not run): ``ServerArgs.add_cli_args``'s argparse
  on ``sglang.args``, ``ServerArgs.from_cli_args``, ``arg_groups.hicache_hook``'s
  ``handle_hicache_ratio_default``/``handle_hicache``; ``sglang.srt.environ.envs`` and
  ``LRUFileEvictor._load_config`` (``_parse_size_to_bytes``) on the file backend's env files;
- read with ast and run: ``MooncakeStoreConfig.load_from_env`` and the rank-subdirectory
  expression of ``MooncakeStore.__init__`` (``mooncake_store.py`` imports Triton kernels and
  Mooncake's native client);
- for the Mooncake backend, also the pinned mooncake-transfer-engine wheel's files: the
  ``MOONCAKE_*`` names in the strings of ``mooncake/store.so`` (the native code that reads
  the offload sizes; it needs CUDA to load).

Renders come from a real apply over the fake GPU host (two namespaces of different sizes)
and from ``kvagent engines render``; the negative tests hand the checker broken renders.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agent.engines import EngineContext, Rendered, render
from agent.engines.base import engine_bytes
from agent.engines.verdict import EngineVerdict, judge
from tests.unit.engines.helpers import parse_env

from .kit import GB, apply_pool, assert_refused, judge_pinned, shim_dir, wheel_files

UNEVEN = (1000 * GB, 500 * GB)
FILE_DIR = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
FILE_MAX = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"
MC_PATH = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
MC_SIZES = ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE")


def judge_mooncake(ctx: EngineContext, rendered: Rendered) -> EngineVerdict:
    """SGLang's checker with the pinned sglang and mooncake-transfer-engine wheels."""
    shims = shim_dir("sglang")
    assert shims is not None
    path = [str(wheel_files("sglang")), str(wheel_files("mooncake-transfer-engine")), str(shims)]
    return judge(ctx, rendered, sys.executable, pythonpath=path)


def envs_of(files: dict[str, str]) -> dict[str, dict[str, str]]:
    return {n: parse_env(t) for n, t in files.items() if n.endswith(".env")}


def assert_accepted(v: EngineVerdict) -> None:
    assert v.verdict == "accepted", (v.problems, v.messages)
    assert v.engine_version == "0.5.23"
    assert "ServerArgs.add_cli_args" in v.method and "without running sglang/__init__.py" \
        in v.method


# ------------------------------------------------------------------ file backend
def test_file_backend_from_apply_uneven_namespaces(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported: ServerArgs' parser and hicache hooks, envs and LRUFileEvictor._load_config,
    on the files the apply wrote for two namespaces of 1 TB and 0.5 TB."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: sglang"], sizes=UNEVEN)
    assert applied.result.ok, applied.result.errors
    ctx, rendered = applied.context("sglang"), applied.rendered("sglang")
    v = judge_pinned(ctx, rendered, "sglang")
    assert_accepted(v)
    assert "LRUFileEvictor._load_config" in v.method
    envs = envs_of(applied.files("sglang"))
    assert sorted(e[FILE_DIR] for e in envs.values()) == sorted(ctx.directories)
    for env in envs.values():
        cap = ctx.cap_of(env[FILE_DIR])
        assert int(env[FILE_MAX]) == engine_bytes(cap) <= cap
    assert ctx.caps()[1] < ctx.caps()[0]


def test_file_backend_from_cli_tensor_parallel(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported (as above), on ``kvagent engines render``'s files for tensor_parallel 4:
    each rank's evictor gets a quarter of the directory's quota less headroom."""
    applied = apply_pool(tmp_path, monkeypatch, ["kind: sglang, tensor_parallel: 4"],
                         sizes=UNEVEN)
    ctx = applied.context("sglang")
    files = applied.cli_render("sglang")
    assert files == applied.files("sglang")
    v = judge_pinned(ctx, Rendered(files, "args"), "sglang")
    assert_accepted(v)
    for env in envs_of(files).values():
        cap = ctx.cap_of(env[FILE_DIR])
        assert int(env[FILE_MAX]) == engine_bytes(cap, 4) and 4 * int(env[FILE_MAX]) <= cap


# ------------------------------------------------------------------ mooncake backend
def test_mooncake_backend_from_apply_tensor_parallel(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported: ServerArgs (backend mooncake) and envs; ast: MooncakeStoreConfig.
    load_from_env and MooncakeStore's rank path; strings of Mooncake's store.so. The apply
    made SGLang's rank_<dp>_<tp>_0_0 directory for each TP rank, under each directory."""
    applied = apply_pool(tmp_path, monkeypatch,
                         ["kind: sglang, backend: mooncake, tensor_parallel: 2"], sizes=UNEVEN)
    assert applied.result.ok, applied.result.errors
    ctx, rendered = applied.context("sglang"), applied.rendered("sglang")
    v = judge_mooncake(ctx, rendered)
    assert_accepted(v)
    assert "MooncakeStoreConfig.load_from_env" in v.method and "store.so" in v.method
    assert sorted(rendered.subdirectories) == sorted(
        os.path.join(d, f"rank_0_{t}_0_0") for d in ctx.directories for t in range(2))
    for sub in rendered.subdirectories:
        assert os.path.isdir(sub) and not os.path.islink(sub)
    envs = envs_of(applied.files("sglang"))
    assert sorted(e[MC_PATH] for e in envs.values()) == sorted(ctx.directories)
    for env in envs.values():
        assert env["MOONCAKE_ENABLE_SSD_OFFLOAD"] == "true"
        cap = ctx.cap_of(env[MC_PATH])
        for key in MC_SIZES:
            assert int(env[key]) == engine_bytes(cap, 2) and 2 * int(env[key]) <= cap


def test_mooncake_backend_from_cli_replicas(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, on ``kvagent engines render``'s files for 2 replicas x tensor_parallel 2:
    one base per replica, so no two Mooncake clients share a rank directory."""
    applied = apply_pool(tmp_path, monkeypatch, [
        "kind: sglang, backend: mooncake, tensor_parallel: 2, data_parallel: 2"], sizes=UNEVEN)
    ctx = applied.context("sglang")
    files = applied.cli_render("sglang")
    assert files == applied.files("sglang")
    assert_accepted(judge_mooncake(ctx, Rendered(files, "args")))
    bases = sorted(e[MC_PATH] for e in envs_of(files).values())
    assert bases == sorted(os.path.join(d, f"replica{r}") for d in ctx.directories
                           for r in range(2))
    for sub in applied.rendered("sglang").subdirectories:
        assert os.path.isdir(sub)


# ------------------------------------------------------------------ broken renders
DIRS = ("/mnt/kv/store1-ns1/sglang", "/mnt/kv/store1-ns2/sglang")
CAPS = (900 * GB, 450 * GB)


def good(backend: str | None = None, tp: int = 2) -> tuple[EngineContext, Rendered]:
    ctx = EngineContext("kv", "sglang", DIRS, sum(CAPS), tensor_parallel=tp,
                        directory_caps=CAPS, backend=backend)
    return ctx, render("sglang", ctx)


def broken(rendered: Rendered, name: str, old: str, new: str) -> Rendered:
    files = dict(rendered.files)
    assert old in files[name], (old, files[name])
    files[name] = files[name].replace(old, new)
    return Rendered(files, rendered.format, rendered.notes, rendered.subdirectories)


def refused(v: EngineVerdict, *words: str) -> None:
    assert_refused(v, *words)


@pytest.mark.parametrize("backend", [None, "mooncake"])
def test_the_good_renders_are_accepted(backend: str | None) -> None:
    """The baselines the broken renders below are cut from."""
    ctx, rendered = good(backend)
    v = judge_mooncake(ctx, rendered) if backend else judge_pinned(ctx, rendered, "sglang")
    assert_accepted(v)


@pytest.mark.parametrize(("old", "new", "words"), [
    # an unknown key: SGLang declares no such variable
    (f"{FILE_MAX}=", "SGLANG_HICACHE_FILE_BACKEND_MAX_BYTES=",
     ("unknown variable SGLANG_HICACHE_FILE_BACKEND_MAX_BYTES",)),
    # a missing required key
    (f"{FILE_MAX}=", "# ", (f"missing required variable {FILE_MAX}",)),
    # a wrong unit: '450Gi' reads (human_readable_int) as 450 GiB, over 900 GB / 2 ranks
    (f"{FILE_MAX}={engine_bytes(CAPS[0], 2)}", f"{FILE_MAX}=450Gi",
     (FILE_MAX, f"{450 * 1024**3} bytes per rank", "quota")),
    # a value SGLang drops with a warning ('Invalid size ... disabling')
    (f"{FILE_MAX}={engine_bytes(CAPS[0], 2)}", f"{FILE_MAX}=lots", ("warned", "Invalid size")),
    # a path outside the pool
    (f"{FILE_DIR}={DIRS[0]}", f"{FILE_DIR}=/tmp/hicache", ("outside the pool", "/tmp/hicache")),
])
def test_file_backend_refuses(old: str, new: str, words: tuple[str, ...]) -> None:
    """Imported: envs, LRUFileEvictor._load_config (as in the tests above)."""
    ctx, rendered = good()
    refused(judge_pinned(ctx, broken(rendered, "sglang-hicache-0.env", old, new), "sglang"),
            *words)


@pytest.mark.parametrize(("old", "new", "words"), [
    ("--hicache-storage-backend file", "--hicache-storage-backend nfs",
     ("argument parser refused", "invalid choice")),
    ("--enable-hierarchical-cache ", "--enable-hierarchical-cach ", ("abbreviation",)),
    ("--enable-hierarchical-cache ", "", ("enable_hierarchical_cache=False",)),
])
def test_arguments_refused(old: str, new: str, words: tuple[str, ...]) -> None:
    """Imported: ServerArgs.add_cli_args' argparse, from_cli_args and the hicache hooks."""
    ctx, rendered = good()
    refused(judge_pinned(ctx, broken(rendered, "sglang.args", old, new), "sglang"), *words)


def test_arguments_rewritten_by_sglang_are_refused() -> None:
    """handle_hicache rewrites layer_first for Mooncake with a warning: refused."""
    ctx, rendered = good("mooncake")
    bad = broken(rendered, "sglang.args", "mooncake",
                 "mooncake --hicache-mem-layout layer_first")
    refused(judge_mooncake(ctx, bad), "rewrote or warned", "layer_first")


@pytest.mark.parametrize(("old", "new", "words"), [
    # Mooncake's own Python switch, which SGLang never reads (its own is ENABLE_SSD_OFFLOAD)
    ("MOONCAKE_ENABLE_SSD_OFFLOAD=", "MOONCAKE_OFFLOAD_ENABLED=",
     ("unknown variable MOONCAKE_OFFLOAD_ENABLED",)),
    ("MOONCAKE_ENABLE_SSD_OFFLOAD=true", "MOONCAKE_ENABLE_SSD_OFFLOAD=on",
     ("warned", "MOONCAKE_ENABLE_SSD_OFFLOAD")),
    (f"{MC_SIZES[0]}=", "# ", (f"missing required variable {MC_SIZES[0]}",)),
    (f"{MC_SIZES[0]}={engine_bytes(CAPS[0], 2)}", f"{MC_SIZES[0]}=436gb",
     (MC_SIZES[0], "int64")),
    (f"{MC_SIZES[1]}={engine_bytes(CAPS[0], 2)}", f"{MC_SIZES[1]}={CAPS[0]}",
     (MC_SIZES[1], "per rank", "quota")),
    (f"{MC_PATH}={DIRS[0]}", f"{MC_PATH}=/var/lib/mooncake", ("outside the pool",)),
    (f"{MC_PATH}={DIRS[0]}", f"{MC_PATH}={DIRS[1]}", ("share",)),
])
def test_mooncake_backend_refuses(old: str, new: str, words: tuple[str, ...]) -> None:
    """ast-loaded MooncakeStoreConfig.load_from_env and rank path; store.so's names."""
    ctx, rendered = good("mooncake")
    refused(judge_mooncake(ctx, broken(rendered, "sglang-mooncake-0.env", old, new)), *words)
