"""SGLang's own file storage on a pool kvagent attached, with kvagent's rendered settings.

A file-backed pool on a tmpfs, exported over NVMe/TCP loopback and attached by kvagent in
the same VM (one namespace, xfs with project quotas), engine ``sglang`` (file backend) with
``tensor_parallel: 2``. kvagent's env file for it (``sglang-hicache.env``:
``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` and ``..._MAX_SIZE``, read from the apply's
files, not assumed) is the environment of ``engine_runner.py``, which loads SGLang
0.5.23's ``HiCacheFile`` and ``LRUFileEvictor`` from the pinned wheel's files (unchanged;
the package ``__init__`` files are not run and ``sglang.srt.utils.common`` is reduced to
the wheel's own ``human_readable_int``: see engine_runner.py) on PyTorch's CPU build, and
runs two of them at once, in two processes, as SGLang's two TP ranks on that directory.

Each rank stores KV pages (CPU bf16 tensors of 128 KiB) through ``HiCacheFile.set``, reads
the first ones back through ``get`` and compares the bytes, then keeps storing until it has
written 3 times its MAX_SIZE. The test asserts: the engine parsed MAX_SIZE as the bytes
kvagent meant and the ranks' caps together fit the directory's hard cap (the xfs project
quota); ``set`` never failed and SGLang logged no warning or error (an ENOSPC surfaces as
``Failed to save tensor``); the bytes read back are the bytes stored; the evictor evicted
(the first pages gone, the last ones readable); the directory's usage (the project quota,
polled while the ranks ran) stayed under the hard cap. It prints the figures.

LMCache 0.5.6's LocalDiskBackend is not run here: it runs without CUDA (its ``cpu`` device
backend, checked on the build machine), but its import chain needs about 30 packages this
venv and the test extra do not have (numba and llvmlite, transformers, huggingface_hub,
aiohttp, opentelemetry, ...), and importing them under TCG would not fit this group's time.
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

from agent.config import load_config
from agent.engines.quota import mount_caps, project_id
from agent.naming import subsystem_nqn
from agent.system.xfsquota import get_quota

from . import kit
from .pools import Lab, assert_ok, mount_tmpfs, umount_all_under

pytestmark = pytest.mark.kernel(group="engine-storage", weight=3)
PREFIX = "nqn.2026-11.io.kvagent"
MIB = 1 << 20
SGLANG = project_id("sglang")
RANKS = 2
PAGE = 128 << 10
FILL = 3.0
RUNNER = Path(__file__).with_name("engine_runner.py")
WHEELS = Path(os.environ.get("KVAGENT_ENGINE_CACHE")
              or Path.home() / ".cache/kvagent/engines")
SGLANG_WHEEL = WHEELS / "sglang-0.5.23"


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
    """Polls the sglang project's usage on ``mount`` in a thread; keeps the peak."""

    def __init__(self, mount: Path, interval: float = 0.1):
        self.mount, self.interval = str(mount), interval
        self.peak, self.samples = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, get_quota(self.mount, SGLANG).used_bytes)
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self) -> QuotaPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_sglang_ranks(env_file: dict[str, str], out: Path) -> list[dict]:
    """engine_runner.py with kvagent's env file as the engine's environment."""
    result = out / "sglang-ranks.json"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "sglang", str(SGLANG_WHEEL), str(result),
         "--ranks", str(RANKS), "--page-bytes", str(PAGE), "--fill", str(FILL)],
        env={**os.environ, **env_file}, capture_output=True, text=True, timeout=480,
        check=False)
    print(proc.stdout + proc.stderr[-4000:])
    assert result.exists(), f"the runner exited {proc.returncode} without a report"
    ranks = json.loads(result.read_text())["ranks"]
    crashed = [r for r in ranks if "crashed" in r]
    assert not crashed and proc.returncode == 0, (proc.returncode, crashed)
    return ranks


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


def test_sglang_hicache_file_on_a_capped_pool(lab: Lab) -> None:
    lap = kit.Laps()
    write_config(lab)
    assert_ok(lab.apply())
    lap("apply")
    mount = lab.root / "mnt/kv/lab-ns1"
    directory = mount / "sglang"
    (env_path,) = sorted((lab.state / "engines/kv/sglang").glob("sglang-hicache*.env"))
    env_file = read_env_file(env_path)
    assert env_file["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == str(directory)
    vfs = os.statvfs(mount)
    cap = mount_caps(vfs.f_blocks * vfs.f_frsize, load_config(lab.config).initiator.pools[0]
                     .engines)["sglang"]
    quota = get_quota(str(mount), SGLANG)
    assert quota.hard_limit_bytes == cap, (quota, cap)

    with QuotaPoller(mount) as poller:
        ranks = run_sglang_ranks(env_file, lab.root)
    lap("two HiCacheFile ranks, stored past their caps")
    os.statvfs(mount)  # let xfs finish freeing the evicted files (background inodegc)
    final = get_quota(str(mount), SGLANG).used_bytes

    for rank in ranks:
        assert_rank(rank, directory, env_file)
    per_rank = ranks[0]["max_size_bytes"]
    assert per_rank * RANKS <= cap, f"the ranks may fill {per_rank * RANKS} > cap {cap}"
    assert 0 < poller.peak <= cap and final <= cap, (poller.peak, final, cap)
    assert not list(directory.glob(".*.tmp")), "half-written files left behind"
    suffix = f"_kvagent-engine-storage-test_0_{RANKS}.bin"
    newest = directory / f"page-{ranks[0]['pages'] - 1:06}{suffix}"
    lsproj = kit.sh("xfs_io", "-r", "-c", "lsproj", str(newest)).stdout
    assert int(lsproj.split("=")[1]) == SGLANG, lsproj  # the quota counts the engine's files

    stored = sum(r["stored_bytes"] for r in ranks)
    evicted = sum(r["pages"] - len(r["survivors"]) for r in ranks)
    print(f"[figure] sglang HiCacheFile x{RANKS} ranks: MAX_SIZE {per_rank} bytes per rank "
          f"(engine's parse), hard cap {cap}; stored {stored} bytes in "
          f"{sum(r['pages'] for r in ranks)} pages of {PAGE}, evicted {evicted} pages; "
          f"usage peak {poller.peak} ({poller.peak * 100 // cap}% of cap, "
          f"{poller.samples} samples), final {final}; per rank "
          + ", ".join(f"{r['rank']}: {r['seconds']}s, {len(r['survivors'])} pages kept"
                      for r in ranks))

    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
    lap("detach")
