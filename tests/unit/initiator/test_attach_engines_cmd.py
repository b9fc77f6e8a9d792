"""``kvagent engines render POOL --engine KIND`` over a prepared state dir and tmp mounts.

The mount check is replaced (the pool's mounts are plain directories here); the
kernel tier runs the same command against a really attached pool.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli.main import main
from agent.config import load_config
from agent.engines import handoff
from agent.state import write_json
from agent.system.gds import GdsReadiness
from tests.unit.engines.helpers import parse_env, probe

UID, GID = os.getuid(), os.getgid()


class Lab:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = root
        self.state = root / "state"
        self.mounts = [str(root / "mnt/kv/ns1"), str(root / "mnt/kv/ns2")]
        self.mounted: set[str] = set(self.mounts)
        monkeypatch.setattr(handoff, "mounted_at",
                            lambda path, mountinfo=None: object() if path in self.mounted
                            else None)
        # This host's GPUDirect Storage, as agent.system.gds.probe_gds would find it.
        self.gds = GdsReadiness("/sys/module/nvidia_fs", "/dev/nvidia-fs0",
                                "/usr/lib/x86_64-linux-gnu/libcufile.so.0")
        monkeypatch.setattr(handoff, "probe_gds", lambda: self.gds)
        self.config = root / "kvagent.yaml"
        self.config.write_text(f"""
version: 1
node: {{name: gpu0, state_dir: {self.state}, run_dir: {root}/run}}
initiator:
  pools:
    - name: kv
      target: {{transport: tcp, address: 10.0.0.1}}
      mount: {root}/mnt/kv
      engines:
        - {{kind: lmcache, capacity: 30%, owner: '{UID}', group: '{GID}'}}
        - {{kind: dynamo, owner: '{UID}', group: '{GID}'}}
    - name: raw
      target: {{transport: tcp, address: 10.0.0.1}}
      mount: {root}/mnt/raw
      shared: true
""")

    def attach(self, *, odirect: bool = True, kinds: tuple[str, ...] = ("lmcache", "dynamo"),
               probes: bool = True) -> None:
        write_json(self.state / "initiator.json", {"pools": {"kv": {
            "hostnqn": "nqn.x", "layout": "per-namespace", "shared": False, "complete": True,
            "subsystems": [{"subsysnqn": "nqn.2026-11.io.kvagent:s:kv:gpu0",
                            "transport": "tcp", "traddr": "10.0.0.1", "trsvcid": "4420"}],
            "devices": [], "mounts": self.mounts, "created_dirs": []}}})
        for m in self.mounts:
            for k in kinds:
                os.makedirs(os.path.join(m, k), exist_ok=True)
        if probes:
            write_json(self.state / "probes/kv.json",
                       [dataclasses.asdict(probe(m, odirect=odirect)) for m in self.mounts])

    def run(self, *args: str):
        return CliRunner().invoke(main, ["-c", str(self.config), *args])


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    return Lab(tmp_path, monkeypatch)


def test_prints_the_engine_file_with_notes_on_stderr(lab: Lab) -> None:
    lab.attach()
    res = lab.run("engines", "render", "kv", "--engine", "lmcache")
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.stdout)
    assert data["local_disk"] == ",".join(f"file://{m}/lmcache/" for m in lab.mounts)
    assert data["extra_config"] == {"use_odirect": True}
    # 30% of each probed mount (10**12 bytes) less 3% headroom, for its one worker.
    assert data["max_local_disk_size"] == pytest.approx(0.97 * 0.3 * 10**12 / 2**30, abs=0.01)
    assert "kvagent: note: max_local_disk_size is per LMCache worker" in res.stderr
    assert "note:" not in res.stdout


def test_json_output_carries_files_notes_and_capacity(lab: Lab) -> None:
    lab.attach(odirect=False)
    res = lab.run("-o", "json", "engines", "render", "kv", "--engine", "dynamo")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["pool"] == "kv" and out["engine"] == "dynamo" and out["format"] == "env"
    assert sorted(out["files"]) == ["dynamo-kvbm-0.env", "dynamo-kvbm-1.env"]
    env = parse_env(out["files"]["dynamo-kvbm-0.env"])
    assert env["DYN_KVBM_DISK_CACHE_DIR"] == f"{lab.mounts[0]}/dynamo"
    assert env["DYN_KVBM_DISK_DISABLE_O_DIRECT"] == "true"  # the recorded probe failed
    assert out["capacity_bytes"] == 2 * 10**12 * 60 // 100
    assert out["directories"] == [f"{m}/dynamo" for m in lab.mounts]
    assert out["probes_from"] == "record"
    assert any("O_DIRECT" in n for n in out["notes"])
    assert res.stderr == ""


def test_dynamo_is_refused_without_gpudirect_storage(lab: Lab) -> None:
    """Disk-only KVBM needs GDS: no nvidia-fs (or no cuFile) is exit 1, naming what is
    missing and how to get it, and no file is printed."""
    lab.attach()
    lab.gds = GdsReadiness(None, None, "/usr/local/cuda/lib64/libcufile.so.0")
    res = lab.run("engines", "render", "kv", "--engine", "dynamo")
    assert res.exit_code == 1, res.output
    assert "nvidia-fs kernel module is not loaded" in res.output
    assert "cuFile" not in res.output.split("missing:")[1].split("hint")[0]
    assert "modprobe nvidia-fs" in res.output and "gds: trust" in res.output
    assert "DYN_KVBM" not in res.output
    lab.gds = GdsReadiness("/proc/driver/nvidia-fs", "/dev/nvidia-fs0", None)
    res = lab.run("engines", "render", "kv", "--engine", "dynamo")
    assert res.exit_code == 1 and "cuFile (libcufile.so) is not installed" in res.output
    # The same host renders the engines that do not depend on GDS.
    assert lab.run("engines", "render", "kv", "--engine", "lmcache").exit_code == 0


def test_dynamo_with_gds_ready_says_so_in_its_notes(lab: Lab) -> None:
    lab.attach()
    res = lab.run("-o", "json", "engines", "render", "kv", "--engine", "dynamo")
    assert res.exit_code == 0, res.output
    notes = json.loads(res.stdout)["notes"]
    assert any("nvidia-fs loaded" in n and "libcufile.so.0" in n for n in notes), notes


def test_the_same_text_as_apply_would_write(lab: Lab) -> None:
    lab.attach()
    cfg = load_config(lab.config)
    pool = cfg.initiator.pools[0]
    probes = [handoff.probe_from_json(p) for p in
              json.loads((lab.state / "probes/kv.json").read_text())]
    lmcache = next(e for e in pool.engines if e.kind == "lmcache")
    want = handoff.render_engine(pool, lmcache, lab.mounts, int(0.3 * 2 * 10**12), probes)
    res = lab.run("engines", "render", "kv", "--engine", "lmcache")
    assert res.stdout == want.files["lmcache.yaml"]


def test_probe_now_runs_the_probes(lab: Lab) -> None:
    lab.attach(probes=False)
    res = lab.run("-o", "json", "engines", "render", "kv", "--engine", "lmcache", "--probe")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["probes_from"] == "now"
    assert all(os.listdir(os.path.join(m, "lmcache")) == [] for m in lab.mounts)


def test_without_a_recorded_probe_it_probes(lab: Lab) -> None:
    lab.attach(probes=False)
    out = json.loads(lab.run("-o", "json", "engines", "render", "kv", "--engine",
                             "lmcache").stdout)
    assert out["probes_from"] == "now"


@pytest.mark.parametrize(("args", "code", "message"), [
    (("nope", "--engine", "lmcache"), 2, "unknown initiator pool 'nope'; this host's config "
                                         "has kv, raw"),
    (("kv", "--engine", "vllm"), 2, "engine 'vllm' is not configured for pool 'kv' (it has "
                                    "lmcache, dynamo)"),
    (("kv", "--engine", "bogus"), 2, "'bogus' is not one of"),
    (("kv",), 2, "Missing option '--engine'"),
])
def test_bad_usage_exits_2(lab: Lab, args: tuple[str, ...], code: int, message: str) -> None:
    lab.attach()
    res = lab.run("engines", "render", *args)
    assert res.exit_code == code and message in res.output, res.output
    assert "Traceback" not in res.output


def test_not_attached_exits_1(lab: Lab) -> None:
    res = lab.run("engines", "render", "kv", "--engine", "lmcache")
    assert res.exit_code == 1
    assert "pool 'kv' is not attached on this host" in res.output
    assert "run kvagent apply" in res.output


def test_not_mounted_exits_1(lab: Lab) -> None:
    lab.attach()
    lab.mounted.discard(lab.mounts[1])
    res = lab.run("engines", "render", "kv", "--engine", "lmcache")
    assert res.exit_code == 1
    assert f"pool 'kv' is not mounted at {lab.mounts[1]}" in res.output


def test_missing_engine_directory_exits_1(lab: Lab) -> None:
    lab.attach(kinds=("lmcache",))
    res = lab.run("engines", "render", "kv", "--engine", "dynamo")
    assert res.exit_code == 1 and "does not exist" in res.output


# ------------------------------------------------------------------ engines check
def _pinned_lmcache(tmp_path: Path) -> str:
    """A Python with LMCache 0.5.6's files on its path, as if installed in it: kvagent's
    venv's behind a wrapper that sets PYTHONPATH (engines check passes the caller's
    environment on to none of them)."""
    from tests.unit.engines.contract.kit import shim_dir, wheel_files

    path = [str(wheel_files("lmcache"))]
    if shim_dir("lmcache") is not None:
        path.append(str(shim_dir("lmcache")))
    python = tmp_path / "engine-python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(os.pathsep.join(path))} "
                      f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    python.chmod(0o755)
    return str(python)


def test_check_reports_the_engines_verdict(lab: Lab, tmp_path: Path) -> None:
    """LMCache's own config loader (the pinned wheel's) accepts what apply would write."""
    lab.attach()
    python = _pinned_lmcache(tmp_path)
    res = lab.run("-o", "json", "engines", "check", "kv", "--engine", "lmcache",
                  "--python", python)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["verdict"], data["engine"], data["problems"]) == ("accepted", "lmcache", [])
    assert data["engine_version"] == "0.5.6" and data["method"]
    text = lab.run("engines", "check", "kv", "--engine", "lmcache", "--python", python)
    assert text.exit_code == 0 and text.stdout.startswith("lmcache 0.5.6: accepted"), text.output


def test_check_fails_with_the_engines_words_on_a_config_it_refuses(
        lab: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from agent.engines import _RENDERERS, Rendered, lmcache

    def broken(ctx):  # a renderer bug: a key LMCache does not know
        good = lmcache.render(ctx)
        text = good.files["lmcache.yaml"] + "local_disk_size_gib: 5\n"
        return Rendered({"lmcache.yaml": text}, "yaml", good.notes)

    monkeypatch.setitem(_RENDERERS, "lmcache", broken)
    lab.attach()
    res = lab.run("engines", "check", "kv", "--engine", "lmcache", "--python",
                  _pinned_lmcache(tmp_path))
    assert res.exit_code == 1, res.output
    assert "lmcache 0.5.6: refused" in res.stdout and "local_disk_size_gib" in res.stdout
    assert "refused the config kvagent rendered for pool 'kv'" in res.stderr


def test_check_without_the_engine_installed_says_so(lab: Lab) -> None:
    lab.attach()
    res = lab.run("-o", "json", "engines", "check", "kv", "--engine", "lmcache",
                  "--python", sys.executable)  # kvagent's venv: no LMCache there
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["verdict"] == "unavailable"
    assert "could not be loaded" in res.stderr and "--python" in res.stderr


def test_check_with_a_python_that_does_not_exist(lab: Lab, tmp_path: Path) -> None:
    """Bad input: exit 2, naming the option."""
    lab.attach()
    res = lab.run("engines", "check", "kv", "--engine", "lmcache",
                  "--python", str(tmp_path / "no/python"))
    assert res.exit_code == 2, res.output
    assert f"--python {tmp_path}/no/python: {tmp_path}/no/python is not a file" in res.stderr
