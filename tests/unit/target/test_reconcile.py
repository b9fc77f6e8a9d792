"""The storage-host pass over nvmet's kernel-like fake configfs and a fake command runner."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import parse_config
from agent.config.model import Config
from agent.result import RunResult
from agent.target import backing_device, backing_lvm, reconcile
from agent.target.reconcile import TargetPass, TargetState
from nvmet.fake import FakeConfigFS
from nvmet.ids import namespace_uuid
from tests.unit.fakerunner import FakeRunner

H1 = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"
H2 = "nqn.2014-08.org.nvmexpress:uuid:6c3f2b4d-1e5a-4c7b-8d2f-6a3b8e0f1c22"
PREFIX = "nqn.2026-11.io.kvagent:stor"
MIB = 1 << 20


def file_pool(root: Path, name: str = "kv", count: int = 2, size: str = "4MiB",
              ports: tuple[str, ...] = ("lo",), hosts: tuple[tuple[str, str], ...] = (
                  ("gpu-1", H1), ("gpu-2", H2))) -> dict[str, Any]:
    return {"name": name, "ports": list(ports),
            "backing": {"kind": "file", "directory": str(root / "files")},
            "namespaces": {"count": count, "size": size},
            "hosts": [{"name": n, "nqn": q} for n, q in hosts]}


def config(root: Path, pools: list[dict[str, Any]], *, wait: str = "0s",
           extra_ports: tuple[dict[str, Any], ...] = ()) -> Config:
    data = {"version": 1, "node": {"name": "stor", "state_dir": str(root / "state"),
                                   "run_dir": str(root / "run")},
            "target": {"address_wait": wait, "pools": pools, "ports": [
                {"name": "lo", "id": 1, "transport": "tcp", "address": "127.0.0.1"},
                *extra_ports]}}
    return parse_config(yaml.safe_dump(data))


class Target:
    """A fake kernel that knows every file a pass creates (as nvmet would open them)."""

    def __init__(self, root: Path):
        self.root = root
        self.fs = FakeConfigFS(check_order=True)
        self.runner = FakeRunner().on(["modprobe"])

    def run(self, cfg: Config, dry_run: bool = False) -> RunResult:
        for path in (self.root / "files").rglob("*.img"):
            self.fs.add_device(str(path), "file")
        # Files created during this pass: register them as the applier would meet them.
        original = reconcile.TargetPass._run_steps

        def run_steps(pass_: TargetPass, plans, failed):  # type: ignore[no-untyped-def]
            out = original(pass_, plans, failed)
            for path in (self.root / "files").rglob("*.img"):
                self.fs.add_device(str(path), "file")
            return out

        result = RunResult(dry_run=dry_run)
        self.fs.start_session()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(reconcile.TargetPass, "_run_steps", run_steps)
            TargetPass(cfg, self.runner, result, fs=self.fs, dry_run=dry_run).run()
        result.finished_at = 0.0
        return result

    def ops(self, op: str | None = None, contains: str = "") -> list[tuple[str, str]]:
        return [(o.op, o.path) for o in self.fs.ops
                if (op is None or o.op == op) and contains in o.path]


@pytest.fixture
def target(tmp_path: Path) -> Target:
    return Target(tmp_path)


def nqn(host: str | None, pool: str = "kv") -> str:
    return f"{PREFIX}:{pool}" + (f":{host}" if host else "")


def test_plan_changes_nothing_and_apply_converges(target: Target, tmp_path: Path) -> None:
    cfg = config(tmp_path, [file_pool(tmp_path)])
    planned = target.run(cfg, dry_run=True)
    assert planned.ok and planned.changed
    assert target.fs.writes == 0 and not (tmp_path / "files").exists()
    assert {a.status for a in planned.actions} == {"planned"}

    first = target.run(cfg)
    assert first.ok, first.errors
    assert first.configfs_writes == target.fs.writes > 0
    for host, hnqn in (("gpu-1", H1), ("gpu-2", H2)):
        sub = f"subsystems/{nqn(host)}"
        assert target.fs.read(f"{sub}/attr_allow_any_host") == "0"
        assert [e.name for e in target.fs.list(f"{sub}/allowed_hosts")] == [hnqn]
        for nsid in (1, 2):
            ns = f"{sub}/namespaces/{nsid}"
            assert target.fs.read(f"{ns}/device_uuid") == namespace_uuid(nqn(host), nsid)
            assert target.fs.read(f"{ns}/device_path") == str(
                tmp_path / f"files/kv/{host}/ns{nsid}.img")
            assert target.fs.read(f"{ns}/enable") == "1"
    assert sorted(e.name for e in target.fs.list("ports/1/subsystems")) == [
        nqn("gpu-1"), nqn("gpu-2")]
    state = TargetState.load(tmp_path / "state")
    assert state.ports == {1} and state.hosts == {H1, H2}
    assert state.pools == {"kv": {"kind": "file", "directory": str(tmp_path / "files")}}

    again = target.run(cfg)
    assert again.ok and not again.changed and again.configfs_writes == 0
    assert target.ops() == []


def test_growing_revalidates_and_keeps_existing_namespaces_enabled(target: Target,
                                                                    tmp_path: Path) -> None:
    target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))]))
    grown = target.run(config(tmp_path, [file_pool(tmp_path, count=3, size="8MiB",
                                                   hosts=(("gpu-1", H1),))]))
    assert grown.ok, grown.errors
    sub = f"subsystems/{nqn('gpu-1')}"
    assert ("write", f"{sub}/namespaces/1/revalidate_size") in target.ops("write")
    assert ("write", f"{sub}/namespaces/2/revalidate_size") in target.ops("write")
    assert ("mkdir", f"{sub}/namespaces/3") in target.ops("mkdir")
    # Existing namespaces were never disabled or rewritten, links never dropped.
    touched = {p for _, p in target.ops() if "/namespaces/1/" in p or "/namespaces/2/" in p}
    assert touched == {f"{sub}/namespaces/1/revalidate_size",
                       f"{sub}/namespaces/2/revalidate_size"}
    assert target.ops("unlink") == [] and target.ops("rmdir") == []
    assert (tmp_path / "files/kv/gpu-1/ns1.img").stat().st_size == 8 * MIB
    kinds = [a.kind for a in grown.actions if a.status == "done"]
    assert kinds.count("file.grow") == 2 and kinds.count("file.create") == 1


def test_adding_a_host_leaves_the_others_alone(target: Target, tmp_path: Path) -> None:
    target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))]))
    added = target.run(config(tmp_path, [file_pool(tmp_path)]))
    assert added.ok
    assert not [p for _, p in target.ops() if nqn("gpu-1") in p and "ports/" not in p]
    assert ("symlink", f"ports/1/subsystems/{nqn('gpu-2')}") in target.ops("symlink")
    assert target.ops("unlink") == []


def test_removed_pool_is_unexported_and_its_files_kept(target: Target, tmp_path: Path) -> None:
    target.run(config(tmp_path, [file_pool(tmp_path), file_pool(tmp_path, name="other")]))
    removed = target.run(config(tmp_path, [file_pool(tmp_path, name="other")]))
    assert removed.ok
    assert target.fs.list("subsystems") and all(
        e.name.startswith(f"{PREFIX}:other:") for e in target.fs.list("subsystems"))
    assert len(list((tmp_path / "files/kv").rglob("*.img"))) == 4
    assert "kv" in TargetState.load(tmp_path / "state").pools, "kept for pool destroy"


def test_missing_address_fails_that_port_alone(target: Target, tmp_path: Path) -> None:
    far = {"name": "far", "id": 2, "transport": "tcp", "address": "10.97.0.1"}
    cfg = config(tmp_path, [file_pool(tmp_path, name="near"),
                            file_pool(tmp_path, name="away", ports=("far",))],
                 extra_ports=(far,))
    result = target.run(cfg)
    assert not result.ok
    assert len(result.errors) == 2, "one per subsystem that could not be linked"
    for error, host in zip(result.errors, ("gpu-1", "gpu-2"), strict=True):
        assert error.pool == "away"
        assert error.message.startswith(
            "port far (nvmet port 2, tcp 10.97.0.1:4420): the address is not configured")
        assert "target.address_wait: 0s" in error.message
        assert f"subsystem {nqn(host, 'away')} is not exported on it" in error.message
        assert "ip addr add 10.97.0.1/" in (error.hint or "")
    failed = [a for a in result.actions if a.status == "failed"]
    assert {a.pool for a in failed} == {"away"}
    assert sorted(e.name for e in target.fs.list("ports/1/subsystems")) == [
        nqn("gpu-1", "near"), nqn("gpu-2", "near")]
    assert target.fs.list("ports/2/subsystems") == []
    # The away pool's subsystems exist, ready for the next pass.
    assert target.fs.exists(f"subsystems/{nqn('gpu-1', 'away')}/namespaces/1")


def test_address_that_appears_while_waiting_comes_up(target: Target, tmp_path: Path) -> None:
    late = {"name": "late", "id": 2, "transport": "tcp", "address": "10.98.0.1"}
    cfg = config(tmp_path, [file_pool(tmp_path, ports=("late",), hosts=(("gpu-1", H1),))],
                 wait="20s", extra_ports=(late,))
    attempts: list[str] = []
    symlink = target.fs.symlink

    def appears_on_second_try(t: str, path: str) -> None:
        if path.startswith("ports/2/subsystems/"):
            attempts.append(path)
            if len(attempts) == 2:
                target.fs.local_addresses.add("10.98.0.1")
        symlink(t, path)

    target.fs.symlink = appears_on_second_try  # type: ignore[method-assign]
    result = target.run(cfg)
    assert result.ok, result.errors
    assert len(attempts) == 2
    assert [e.name for e in target.fs.list("ports/2/subsystems")] == [nqn("gpu-1")]


def test_a_device_serves_one_pool_only(target: Target, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A device listed by a device pool and by another pool's volume group: both refused,
    before any probe of the device and before any change."""
    dev = "/dev/disk/by-id/kvagent-unit-test-no-such-device"
    alias = "/dev/kvagent-unit-test-nvme7n1"
    real = {dev: "/dev/nvme7n1", alias: "/dev/nvme7n1"}
    monkeypatch.setattr(reconcile, "device_usage", functools.partial(
        reconcile.device_usage, resolve=lambda p: real.get(p, p)))
    monkeypatch.setattr(backing_lvm, "ensure_blank",
                        lambda *a: pytest.fail("probed a device that is in use"))
    monkeypatch.setattr(backing_device, "ensure_blank",
                        lambda *a: pytest.fail("probed a device that is in use"))
    target.runner.on(["vgs"], stdout=json.dumps({"report": [{"vg": []}]}))
    target.runner.on(["lvs"], stdout=json.dumps({"report": [{"lv": []}]}))
    pools = [{"name": "whole", "ports": ["lo"], "hosts": [{"name": "gpu-1", "nqn": H1}],
              "backing": {"kind": "device", "devices": [{"path": dev, "host": "gpu-1"}]}},
             {"name": "carved", "ports": ["lo"], "hosts": [{"name": "gpu-1", "nqn": H1}],
              "backing": {"kind": "lvm", "volume_group": "vgk", "devices": [alias]},
              "namespaces": {"count": 1, "size": "4MiB"}},
             file_pool(tmp_path, name="fine")]
    for dry_run in (True, False):
        result = target.run(config(tmp_path, pools), dry_run=dry_run)
        messages = {e.pool: e.message for e in result.errors}
        assert set(messages) == {"whole", "carved"}
        assert f"refusing to export {dev}" in messages["whole"]
        assert f"listed by pool carved as {alias} for volume group vgk" in messages["whole"]
        assert f"refusing to create volume group on {alias}" in messages["carved"]
        assert f"listed by pool whole (kind: device) as {dev}" in messages["carved"]
        assert "A device serves one pool only" in messages["carved"]
        assert target.runner.ran("vgcreate") == []
        assert not (tmp_path / "state" / backing_device.CLAIMS).exists()
    # The other pool applied.
    assert target.fs.exists(f"subsystems/{nqn('gpu-1', 'fine')}/namespaces/2")
    assert not [e for e in target.fs.list("subsystems") if ":whole" in e.name or
                ":carved" in e.name]
