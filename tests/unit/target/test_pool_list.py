"""``kvagent pool list``: the devices behind each namespace (an LV's PVs from its segments,
a file's filesystem's device, a whole device), in JSON and in the text table."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import pool_cmd
from agent.cli.main import main
from agent.records import Binding, PoolRecord, Storage, TargetRecords
from agent.system import mounts
from agent.target.backings import file
from agent.target.inventory import list_pools
from tests.unit.fakerunner import FakeRunner

PREFIX = "nqn.2026-11.io.kvagent:stor"
LVS = json.dumps({"report": [{"lv": [
    # One row per segment: a spread LV, a striped one, one grown onto a second PV.
    {"lv_path": "/dev/vg0/kv_lv_gpu-1_1", "lv_name": "kv_lv_gpu-1_1", "vg_name": "vg0",
     "devices": "/dev/nvme1n1(0)"},
    {"lv_path": "/dev/vg0/kv_lv_gpu-1_2", "lv_name": "kv_lv_gpu-1_2", "vg_name": "vg0",
     "devices": "/dev/nvme1n1(256),/dev/nvme2n1(0)"},
    {"lv_path": "/dev/vg0/kv_lv_gpu-1_3", "lv_name": "kv_lv_gpu-1_3", "vg_name": "vg0",
     "devices": "/dev/nvme3n1(0)"},
    {"lv_path": "/dev/vg0/kv_lv_gpu-1_3", "lv_name": "kv_lv_gpu-1_3", "vg_name": "vg0",
     "devices": "/dev/nvme4n1(0)"}]}]})


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Records of three pools (lvm, file, device); a mount table that puts the file pool's
    directory on /dev/fake1; a by-id link for the device."""
    state = tmp_path / "state"
    files = tmp_path / "files/fl/gpu-1"
    files.mkdir(parents=True)
    (files / "ns1.img").write_bytes(b"")
    dev = os.stat(files / "ns1.img").st_dev
    table = tmp_path / "mountinfo"
    table.write_text(f"36 1 {os.major(dev)}:{os.minor(dev)} / {tmp_path} rw - xfs /dev/fake1 "
                     "rw\n")
    monkeypatch.setattr(file, "filesystem_device",
                        lambda p: mounts.filesystem_device(p, table))
    (tmp_path / "by-id").mkdir()
    (tmp_path / "nvme9n1").write_text("")
    os.symlink(tmp_path / "nvme9n1", tmp_path / "by-id/nvme-X")
    records = TargetRecords(pools={"lv": PoolRecord("lvm", {"volume_group": "vg0"}),
                                   "fl": PoolRecord("file", {"directory": str(tmp_path)}),
                                   "dv": PoolRecord("device", {})})

    def bind(pool: str, nsid: int, storage: Storage) -> None:
        nqn = f"{PREFIX}:{pool}:gpu-1"
        records.bindings[(nqn, nsid)] = Binding(nqn, nsid, f"u-{pool}{nsid}", "g", pool,
                                                "gpu-1", storage)

    for n in (1, 2, 3):
        bind("lv", n, Storage("lvm", f"/dev/vg0/kv_lv_gpu-1_{n}"))
    bind("fl", 1, Storage("file", str(files / "ns1.img")))
    bind("dv", 1, Storage("device", str(tmp_path / "by-id/nvme-X")))
    records.save(state)
    (tmp_path / "kvagent.yaml").write_text(yaml.safe_dump({
        "version": 1, "node": {"name": "stor", "state_dir": str(state),
                               "run_dir": str(tmp_path / "run"),
                               "configfs": str(tmp_path / "no-configfs")}}))
    return tmp_path


def devices_of(listing: list[dict]) -> dict[tuple[str, int], list[str] | None]:
    return {(p["name"], ns["nsid"]): ns["devices"] for p in listing for ns in p["namespaces"]}


def test_pool_list_shows_the_devices_behind_each_namespace(host: Path) -> None:
    from agent.config import load_config

    runner = FakeRunner().on(["lvs"], stdout=LVS)
    listing = list_pools(load_config(host / "kvagent.yaml"), runner=runner)
    assert devices_of(listing) == {
        ("dv", 1): [str(host / "nvme9n1")],
        ("fl", 1): ["/dev/fake1"],
        ("lv", 1): ["/dev/nvme1n1"],
        ("lv", 2): ["/dev/nvme1n1", "/dev/nvme2n1"],
        ("lv", 3): ["/dev/nvme3n1", "/dev/nvme4n1"]}
    # One lvs for every LV (segments), asked for kvagent's LVs only.
    (call,) = runner.calls
    assert call[0] == "lvs" and "devices" in call[call.index("-o") + 1] and call[-1] == "@kvagent"


def test_pool_list_cli_json_and_text(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_cmd, "default_runner", lambda: FakeRunner().on(["lvs"], stdout=LVS))
    cfg = str(host / "kvagent.yaml")
    shown = CliRunner().invoke(main, ["-c", cfg, "-o", "json", "pool", "list"])
    assert shown.exit_code == 0, shown.output
    assert devices_of(json.loads(shown.stdout)["pools"])[("lv", 2)] == [
        "/dev/nvme1n1", "/dev/nvme2n1"]
    text = CliRunner().invoke(main, ["-c", cfg, "pool", "list"])
    assert text.exit_code == 0, text.output
    rows = [line.split() for line in text.stdout.splitlines()]
    assert ["POOL", "HOST", "NSID", "STORAGE", "DEVICES"] in rows
    assert ["lv", "gpu-1", "2", "/dev/vg0/kv_lv_gpu-1_2", "/dev/nvme1n1,/dev/nvme2n1"] in rows
    assert ["fl", "gpu-1", "1", str(host / "files/fl/gpu-1/ns1.img"), "/dev/fake1"] in rows


def test_devices_that_cannot_be_read_show_as_unknown(host: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_cmd, "default_runner",
                        lambda: FakeRunner().on(["lvs"], returncode=5, stderr="lvm is broken"))
    cfg = str(host / "kvagent.yaml")
    shown = CliRunner().invoke(main, ["-c", cfg, "-o", "json", "pool", "list"])
    assert shown.exit_code == 0, shown.output
    found = devices_of(json.loads(shown.stdout)["pools"])
    assert found[("lv", 1)] is None and found[("fl", 1)] == ["/dev/fake1"]
    text = CliRunner().invoke(main, ["-c", cfg, "pool", "list"])
    assert ["lv", "gpu-1", "1", "/dev/vg0/kv_lv_gpu-1_1", "?"] in [
        line.split() for line in text.stdout.splitlines()]
