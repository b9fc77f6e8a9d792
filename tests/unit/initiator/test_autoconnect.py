"""Stray controllers (kvagent's subsystems that no pool of this host attaches) and
whether nvme-cli's autoconnect rule is active: agent.initiator.autoconnect, and how a
GPU host's health shows them."""

from __future__ import annotations

import os
from pathlib import Path

import jsonschema
import yaml

from agent.config import parse_config
from agent.health import collect as collect_module
from agent.health.collect import collect
from agent.health.metrics import render_metrics
from agent.health.snapshot import exit_code, host_problems, overall_state
from agent.health.status import load_status_schema, to_status_json
from agent.initiator.autoconnect import (
    RULE,
    nvme_cli_autoconnect_active,
    stray_cause,
    stray_controllers,
)
from agent.initiator.sysfs import Sysfs
from tests.unit.fakerunner import FakeRunner
from tests.unit.initiator.fakesysfs import FakeSysfs

HOST = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"
PREFIX = "nqn.2026-11.io.kvagent"


def rule_dirs(tmp: Path) -> tuple[Path, Path, Path]:
    dirs = (tmp / "etc", tmp / "run", tmp / "lib")
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def test_the_rule_as_shipped_is_active_and_a_mask_or_an_empty_override_is_not(
        tmp_path: Path) -> None:
    etc, run, lib = rule_dirs(tmp_path)
    assert not nvme_cli_autoconnect_active((etc, run, lib)), "no rule anywhere"
    (lib / RULE).write_text('ACTION=="change", RUN+="nvmf-connect"\n')
    assert nvme_cli_autoconnect_active((etc, run, lib))
    os.symlink("/dev/null", etc / RULE)
    assert not nvme_cli_autoconnect_active((etc, run, lib)), "masked in /etc"
    (etc / RULE).unlink()
    (run / RULE).write_text("")
    assert not nvme_cli_autoconnect_active((etc, run, lib)), "an empty override"
    (etc / RULE).write_text("# the admin's own version\nACTION==\"change\"\n")
    assert nvme_cli_autoconnect_active((etc, run, lib)), "/etc's own rule wins over /run"
    assert "ln -s /dev/null /etc/udev/rules.d/70-nvmf-autoconnect.rules" in stray_cause(
        (etc, run, lib))


def sysfs_with(tmp: Path, nqns: list[str]) -> FakeSysfs:
    fake = FakeSysfs(tmp / "sys")
    for i, nqn in enumerate(nqns, start=2):
        fake.add_controller(i, subsysnqn=nqn, hostnqn=HOST)
    return fake


def test_strays_are_kvagents_subsystems_of_pools_this_host_does_not_attach(
        tmp_path: Path) -> None:
    nqns = [f"{PREFIX}:stor1:kv:gpu1", f"{PREFIX}:stor1:kv2:gpu1", f"{PREFIX}:stor2:kv",
            f"{PREFIX}:stor2:old", "nqn.2014-08.org.nvmexpress.discovery",
            "nqn.2020-01.com.vendor:array7"]
    sysfs_with(tmp_path, nqns)
    found = Sysfs(str(tmp_path / "sys")).controllers()
    strays = stray_controllers(found, PREFIX, ["kv"])
    assert [c.subsysnqn for c in strays] == [f"{PREFIX}:stor1:kv2:gpu1", f"{PREFIX}:stor2:old"]
    assert stray_controllers(found, PREFIX, ["kv", "kv2", "old"]) == []


def gpu_config(tmp: Path):
    return parse_config(yaml.safe_dump({
        "version": 1, "node": {"name": "gpu1", "nqn_prefix": PREFIX,
                               "state_dir": str(tmp / "state"), "sysfs": str(tmp / "sys")},
        "initiator": {"pools": [{"name": "kv", "mount": str(tmp / "mnt"),
                                 "target": {"transport": "tcp", "address": "10.0.0.1"}}]}}))


def test_a_stray_degrades_the_host_and_says_what_to_do(tmp_path: Path, monkeypatch) -> None:
    etc, run, lib = rule_dirs(tmp_path / "udev")
    (lib / RULE).write_text('ACTION=="change"\n')
    monkeypatch.setattr(collect_module, "stray_cause",
                        lambda: stray_cause((etc, run, lib)))
    sysfs_with(tmp_path, [f"{PREFIX}:stor1:kv2:gpu1"])
    snap = collect(gpu_config(tmp_path), FakeRunner(), drives=False)
    (stray,) = snap.strays
    assert (stray.name, stray.traddr, stray.trsvcid) == ("nvme2", "127.0.0.1", "4420")
    assert overall_state(snap) != "ok" and exit_code(snap) == 1
    (line,) = [p for p in host_problems(snap) if "nvme2" in p]
    assert f"{PREFIX}:stor1:kv2:gpu1" in line and "no pool of this host attaches" in line
    assert "autoconnect rule is active" in line and "nvme disconnect -d nvme2" in line
    doc = to_status_json(snap)
    jsonschema.validate(doc, load_status_schema())
    assert doc["stray_controllers"] == [{"name": "nvme2", "subsysnqn": stray.subsysnqn,
                                         "traddr": "127.0.0.1", "trsvcid": "4420",
                                         "state": "live"}]
    assert "kvagent_stray_controllers 1.0" in render_metrics(snap).decode()
    # Masked: the line names another tool instead.
    os.symlink("/dev/null", etc / RULE)
    (line,) = [p for p in host_problems(collect(gpu_config(tmp_path), FakeRunner(),
                                                drives=False)) if "nvme2" in p]
    assert "another tool connected it" in line


def test_a_storage_only_host_has_no_strays(tmp_path: Path) -> None:
    """Controllers on a host without initiator pools are none of kvagent's business."""
    from tests.unit.health.test_collect import applied

    cfg, fs = applied(tmp_path)
    sysfs_with(tmp_path, [f"{PREFIX}:stor:kv:gpu"])
    snap = collect(cfg, FakeRunner(), fs=fs, drives=False)
    assert snap.strays == () and exit_code(snap) == 0
