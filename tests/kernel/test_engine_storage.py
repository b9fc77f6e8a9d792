"""SGLang's and LMCache's own file storage on a pool kvagent attached, with kvagent's
rendered settings.

A file-backed pool on a tmpfs, exported over NVMe/TCP loopback and attached by kvagent in
the same VM (one namespace, xfs with project quotas), engines ``sglang`` (file backend,
``tensor_parallel: 2``) and ``lmcache``, 10% each. kvagent's files for them are read from
the apply's state directory, not assumed: SGLang's env file (``sglang-hicache.env``:
``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` and ``..._MAX_SIZE``) is the environment of
``engine_runner.py``, and LMCache's ``lmcache.yaml`` is its ``LMCACHE_CONFIG_FILE``. The
runner imports torch (PyTorch's CPU build) once and forks, all at once:

- two SGLang 0.5.23 TP ranks on the sglang directory, each with its own ``HiCacheFile``
  and ``LRUFileEvictor`` loaded from the pinned wheel's files (unchanged; the package
  ``__init__`` files are not run and ``sglang.srt.utils.common`` is reduced to the
  wheel's own ``human_readable_int``: see engine_runner.py);
- one LMCache 0.5.6 worker (lmcache_runner.py): the pinned wheel's modules, imported with
  their real dependencies (numba, aiohttp, pyzmq, ...; only the
  ``lmcache.v1.storage_backend`` package ``__init__``, which imports every other backend
  and transformers, is not run), its config loaded by LMCache's own
  ``lmcache_get_or_create_config()``, and its own ``LocalDiskBackend`` over a
  ``LocalCPUBackend`` on LMCache's ``cpu`` device (no CUDA).

Each stores KV pages/chunks (CPU bf16 tensors) through the engine's own calls
(``HiCacheFile.set``; ``LocalDiskBackend.batched_submit_put_task``), reads the first ones
back (``get``; ``get_blocking``) and compares the bytes, then keeps storing until it has
written 3 times its size limit. The test asserts, for each engine: the engine parsed the
size as the bytes kvagent meant (SGLang's MAX_SIZE bytes; LMCache's
``max_local_disk_size`` GiB times 1024**3) and its writers together fit the directory's
hard cap (the xfs project quota); no store failed (an ENOSPC is SGLang's ``Failed to save
tensor``; LMCache drops a failed write's exception, so a write whose completion callback
never came is a failure) and the engine logged no error (and no warning while storing);
the bytes read back are the bytes stored; the evictor evicted (the first gone, the last
readable); the directory's usage (its project quota, polled while the engines ran)
stayed under its hard cap. It prints the figures.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from agent.config import load_config
from agent.engines.quota import mount_caps, project_id
from agent.naming import subsystem_nqn
from agent.system.xfsquota import get_quota

from . import kit
from .pools import Lab, assert_ok, mount_tmpfs, umount_all_under

pytestmark = pytest.mark.kernel(group="lifecycle", weight=1.6)
PREFIX = "nqn.2026-11.io.kvagent"
MIB = 1 << 20
SGLANG = project_id("sglang")
LMCACHE = project_id("lmcache")
RANKS = 2
PAGE = 128 << 10
CHUNK = 256 << 10
GIB = 1 << 30
# LMCache logs this once per backend it builds when no cache controller is configured
# (local_cpu_backend.py, local_disk_backend.py): expected without a controller.
LMCACHE_SETUP_WARNINGS = {"Controller message sender is not initialized"}
FILL = 3.0
RUNNER = Path(__file__).with_name("engine_runner.py")
WHEELS = Path(os.environ.get("KVAGENT_ENGINE_CACHE")
              or Path.home() / ".cache/kvagent/engines")
SGLANG_WHEEL = WHEELS / "sglang-0.5.23"
LMCACHE_WHEEL = WHEELS / "lmcache-0.5.6"


def write_config(lab: Lab) -> None:
    nqn = subsystem_nqn(PREFIX, "lab", "kv", "lab")
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 32, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 400MiB}}
      ports: [p]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
initiator:
  device_wait: 60s
  pools:
    - name: kv
      target: {{transport: tcp, address: 127.0.0.1, service: 4420, subsystem: "{nqn}"}}
      mount: {lab.root}/mnt/kv
      connect: {{ctrl_loss_tmo: forever, reconnect_delay: 2s}}
      engines:
        - {{kind: sglang, capacity: 10%, tensor_parallel: {RANKS}}}
        - {{kind: lmcache, capacity: 10%}}
""")


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "600m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a rendered env file (values unquoted as a shell would)."""
    env = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            (env[key.strip()],) = shlex.split(value) or [""]
    return env


class QuotaPoller:
    """Polls the usage of each project in ``projects`` on ``mount`` in a thread; keeps
    each one's peak."""

    def __init__(self, mount: Path, projects: tuple[int, ...], interval: float = 0.1):
        self.mount, self.interval = str(mount), interval
        self.peak = dict.fromkeys(projects, 0)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for project in self.peak:
                used = get_quota(self.mount, project).used_bytes
                self.peak[project] = max(self.peak[project], used)
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self) -> QuotaPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_engines(env_file: dict[str, str], lmcache_yaml: Path, out: Path) -> dict:
    """engine_runner.py with kvagent's env file and LMCache config as the engines'
    environment; its report (``ranks``: SGLang's, ``lmcache``: LMCache's)."""
    result = out / "engines.json"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(result), "--fill", str(FILL),
         "--sglang", str(SGLANG_WHEEL), "--ranks", str(RANKS), "--page-bytes", str(PAGE),
         "--lmcache", str(LMCACHE_WHEEL), "--chunk-bytes", str(CHUNK)],
        # NUMBA_CACHE_DIR: LMCache's CPU kernels are @njit(cache=True), and numba refuses
        # them at import when it cannot write its cache beside the wheel's files (a
        # read-only view in the VM); numba's own setting puts that cache elsewhere.
        env={**os.environ, **env_file, "LMCACHE_CONFIG_FILE": str(lmcache_yaml),
             "NUMBA_CACHE_DIR": str(out / "numba-cache")},
        capture_output=True, text=True, timeout=480, check=False)
    print(proc.stdout[-6000:] + proc.stderr[-6000:])
    assert result.exists(), f"the runner exited {proc.returncode} without a report"
    report = json.loads(result.read_text())
    crashed = [r for r in [*report["ranks"], report["lmcache"]] if "crashed" in r]
    assert not crashed and proc.returncode == 0, (proc.returncode, crashed)
    assert "LMCache ERROR" not in proc.stdout + proc.stderr, "LMCache logged an error"
    return report


def assert_rank(rank: dict, directory: Path, env_file: dict[str, str]) -> None:
    """What one rank's own HiCacheFile did on kvagent's settings."""
    name = f"rank {rank['rank']}"
    assert rank["file_path"] == str(directory), name
    # The engine's own parse of MAX_SIZE: the plain byte count kvagent wrote.
    assert rank["max_size_bytes"] == int(env_file["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"])
    assert rank["eviction_enabled"], name
    problems = [line for line in rank["log"] if line[0] in ("WARNING", "ERROR", "CRITICAL")]
    assert not problems, f"{name}: SGLang logged {problems}"
    assert rank["failures"] == [], f"{name}: set() failed for pages {rank['failures'][:10]}"
    assert rank["first_match"] == [True] * 8, f"{name}: bytes read back differ"
    assert rank["last_match"], f"{name}: the last page did not read back"
    survivors = rank["survivors"]
    assert survivors and 0 not in survivors, f"{name}: nothing was evicted"
    assert survivors[-1] == rank["pages"] - 1, f"{name}: the newest page is gone"
    assert rank["stored_bytes"] >= (FILL - 0.1) * rank["max_size_bytes"], name
    assert rank["tracked_bytes"] <= rank["max_size_bytes"], name


def assert_lmcache(lm: dict, directory: Path, config: dict, cap: int) -> None:
    """What LMCache's own LocalDiskBackend did on kvagent's lmcache.yaml."""
    assert lm["engine_version"] == "0.5.6", lm["engine_version"]
    # The engine's own parse of local_disk (file:// stripped) and of max_local_disk_size:
    # GiB, LocalDiskBackend's int(size * 1024**3), at most the cap for its one worker.
    assert os.path.normpath(lm["path"]) == str(directory), lm["path"]
    assert lm["local_disk"] == config["local_disk"].removeprefix("file://"), lm["local_disk"]
    assert lm["max_local_disk_size"] == config["max_local_disk_size"]
    assert lm["max_cache_size"] == int(config["max_local_disk_size"] * GIB)
    assert 0 < lm["max_cache_size"] <= cap, (lm["max_cache_size"], cap)
    assert lm["use_odirect"] == config["extra_config"]["use_odirect"]
    problems = [line for line in lm["log"] if line[1] in ("ERROR", "CRITICAL")
                or (line[1] == "WARNING" and (line[0] == "run"
                                              or line[2] not in LMCACHE_SETUP_WARNINGS))]
    assert not problems, f"LMCache logged {problems}"
    assert lm["failures"] == [], f"LMCache's writes failed for chunks {lm['failures'][:10]}"
    assert lm["put_tasks_left"] == 0, "writes still in flight"
    assert lm["first_match"] == [True] * 8, "LMCache: bytes read back differ"
    assert lm["last_match"], "LMCache: the last chunk did not read back"
    survivors = lm["survivors"]
    assert survivors and 0 not in survivors, "LMCache: nothing was evicted"
    assert survivors[-1] == lm["chunks"] - 1, "LMCache: the newest chunk is gone"
    assert lm["stored_bytes"] >= (FILL - 0.1) * lm["max_cache_size"]
    assert lm["current_cache_size"] <= lm["max_cache_size"]
    # LMCache's index and the directory agree: evicted files are gone from the disk.
    assert lm["on_disk"] == {"files": lm["tracked"], "bytes": lm["current_cache_size"]}, lm


def sglang_figures(ranks: list[dict], cap: int, peak: int, final: int) -> str:
    per_rank = ranks[0]["max_size_bytes"]
    stored = sum(r["stored_bytes"] for r in ranks)
    evicted = sum(r["pages"] - len(r["survivors"]) for r in ranks)
    return (f"sglang HiCacheFile x{RANKS} ranks: MAX_SIZE {per_rank} bytes per rank "
            f"(engine's parse), hard cap {cap}; stored {stored} bytes in "
            f"{sum(r['pages'] for r in ranks)} pages of {PAGE}, evicted {evicted} pages; "
            f"usage peak {peak} ({peak * 100 // cap}% of cap), final {final}; per rank "
            + ", ".join(f"{r['rank']}: {r['seconds']}s, {len(r['survivors'])} pages kept"
                        for r in ranks))


def lmcache_figures(lm: dict, cap: int, peak: int, final: int) -> str:
    evicted = lm["chunks"] - len(lm["survivors"])
    return (f"lmcache {lm['engine_version']} LocalDiskBackend: max_local_disk_size "
            f"{lm['max_local_disk_size']} GiB = {lm['max_cache_size']} bytes (engine's "
            f"parse), hard cap {cap}; stored {lm['stored_bytes']} bytes in {lm['chunks']} "
            f"chunks of {lm['chunk_bytes']} in {lm['seconds']}s (import {lm['import_seconds']}s),"
            f" evicted {evicted}, kept {lm['tracked']} ({lm['on_disk']['bytes']} bytes on "
            f"disk); usage peak {peak} ({peak * 100 // cap}% of cap), final {final}")


def project_of(path: Path | str) -> int:
    """The xfs project id of a file (xfs_io lsproj)."""
    return int(kit.sh("xfs_io", "-r", "-c", "lsproj", str(path)).stdout.split("=")[1])


def test_engines_own_storage_on_a_capped_pool(lab: Lab) -> None:
    lap = kit.Laps()
    write_config(lab)
    assert_ok(lab.apply())
    lap("apply")
    mount = lab.root / "mnt/kv/lab-ns1"
    directory, lm_directory = mount / "sglang", mount / "lmcache"
    (env_path,) = sorted((lab.state / "engines/kv/sglang").glob("sglang-hicache*.env"))
    env_file = read_env_file(env_path)
    assert env_file["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == str(directory)
    lm_yaml = lab.state / "engines/kv/lmcache/lmcache.yaml"
    lm_config = yaml.safe_load(lm_yaml.read_text())
    assert lm_config["local_disk"] == f"file://{lm_directory}/", lm_config
    vfs = os.statvfs(mount)
    caps = mount_caps(vfs.f_blocks * vfs.f_frsize, load_config(lab.config).initiator.pools[0]
                      .engines)
    cap, lm_cap = caps["sglang"], caps["lmcache"]
    assert get_quota(str(mount), SGLANG).hard_limit_bytes == cap, cap
    assert get_quota(str(mount), LMCACHE).hard_limit_bytes == lm_cap, lm_cap

    with QuotaPoller(mount, (SGLANG, LMCACHE)) as poller:
        report = run_engines(env_file, lm_yaml, lab.root)
    lap(f"two HiCacheFile ranks and an LMCache LocalDiskBackend, stored past their caps "
        f"({poller.samples} quota samples)")
    os.statvfs(mount)  # let xfs finish freeing the evicted files (background inodegc)
    final = get_quota(str(mount), SGLANG).used_bytes
    lm_final = get_quota(str(mount), LMCACHE).used_bytes

    ranks, lm = report["ranks"], report["lmcache"]
    for rank in ranks:
        assert_rank(rank, directory, env_file)
    per_rank = ranks[0]["max_size_bytes"]
    assert per_rank * RANKS <= cap, f"the ranks may fill {per_rank * RANKS} > cap {cap}"
    assert 0 < poller.peak[SGLANG] <= cap and final <= cap, (poller.peak, final, cap)
    assert not list(directory.glob(".*.tmp")), "half-written files left behind"
    suffix = f"_kvagent-engine-storage-test_0_{RANKS}.bin"
    newest = directory / f"page-{ranks[0]['pages'] - 1:06}{suffix}"
    assert project_of(newest) == SGLANG  # the quota counts the engine's files

    assert_lmcache(lm, lm_directory, lm_config, lm_cap)
    assert 0 < poller.peak[LMCACHE] <= lm_cap and lm_final <= lm_cap, (poller.peak, lm_cap)
    assert Path(lm["last_file"]).parent == lm_directory, lm["last_file"]
    assert project_of(lm["last_file"]) == LMCACHE

    print("[figure] " + sglang_figures(ranks, cap, poller.peak[SGLANG], final))
    print("[figure] " + lmcache_figures(lm, lm_cap, poller.peak[LMCACHE], lm_final))

    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
    lap("detach")
