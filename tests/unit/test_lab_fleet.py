"""``scripts/lab --fleet`` (scripts/lab-fleet) without machines: the help names it, the two
configs it writes validate and fit each other, and a failed step fails loudly with the
machines powered off."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from click.testing import CliRunner

from agent.cli.main import main

REPO = Path(__file__).resolve().parents[2]
GPU_NQN = "nqn.2014-08.org.nvmexpress:uuid:0b6c1c9e-1f2a-4c3d-8e4f-5a6b7c8d9e0f"


def load_lab_fleet() -> ModuleType:
    loader = SourceFileLoader("kvagent_scripts_lab_fleet", str(REPO / "scripts/lab-fleet"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_scripts_lab_help_documents_fleet_and_boots_nothing() -> None:
    # (its own process group: a scripts/lab that ignored --help would start the lab)
    proc = subprocess.Popen([str(REPO / "scripts/lab"), "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("scripts/lab --help ran the lab instead of printing its help")
    assert proc.returncode == 0, out
    assert "scripts/lab --fleet" in out and "scripts/lab-fleet" in out, out
    assert "docs/lab-fleet-transcript.txt" in out, out
    assert (REPO / "docs/lab-fleet-transcript.txt").exists()


def test_the_configs_it_writes_validate_and_fit_each_other(tmp_path: Path) -> None:
    lab = load_lab_fleet()
    storage, gpu = tmp_path / "storage1.yaml", tmp_path / "gpu1.yaml"
    storage.write_text(lab.storage_config("10.77.0.11", GPU_NQN))
    gpu.write_text(lab.gpu_config("10.77.0.11"))
    result = CliRunner().invoke(main, ["config", "validate", str(storage), str(gpu)])
    assert result.exit_code == 0, result.output
    assert "node storage1; target pools: kv" in result.output
    assert "node gpu1; initiator pools: kv" in result.output
    s, g = yaml.safe_load(storage.read_text()), yaml.safe_load(gpu.read_text())
    (port,) = s["target"]["ports"]
    (exported,) = s["target"]["pools"]
    (attached,) = g["initiator"]["pools"]
    assert exported["name"] == attached["name"] == lab.POOL
    assert exported["hosts"] == [{"name": "gpu1", "nqn": GPU_NQN}]
    assert (attached["target"]["address"], attached["target"]["service"]) == (
        port["address"], port["service"]) == ("10.77.0.11", 4420)
    assert attached["mount"] == lab.MNT
    assert [e["kind"] for e in attached["engines"]] == ["lmcache", "vllm"]
    assert exported["backing"]["devices"] == [lab.DRIVE]


FAKE_FLEET = """#!/bin/sh
# scripts/fleet's stand-in: `up` writes fleet.json, then fails; `down` is recorded.
echo "$@" >> "$KVLAB_CALLS"
case "$1" in
  up) echo '[]' > "$2/fleet.json"; echo "a machine did not come up" >&2; exit 1 ;;
esac
"""


def test_a_failed_step_fails_loudly_and_powers_the_machines_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lab = load_lab_fleet()
    fake = tmp_path / "fleet"
    fake.write_text(FAKE_FLEET)
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("KVLAB_CALLS", str(calls))
    monkeypatch.setattr(lab, "FLEET", [str(fake)])
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["lab-fleet", "--out", str(out)])
    assert lab.main() == 1
    printed = capsys.readouterr().out
    assert "LAB STEP FAILED: scripts/fleet up" in printed, printed
    assert f"$ scripts/fleet up {out} storage1 gpu1" in printed, printed
    assert calls.read_text().splitlines() == [
        f"up {out} storage1 gpu1 --timeout 1500", f"down {out}"]
    assert f"storage1: console {out}/storage1.console" in printed, printed
