"""The storage-host pass over nvmet's kernel-like fake configfs and a fake command runner."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from agent.records import FileManifest, TargetRecords
from agent.target import reconcile
from agent.target.backings import device as backing_device
from agent.target.backings import lvm as backing_lvm

from .helpers import H1, H2, MIB, PREFIX, Target, config, file_pool, nqn


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
        manifest = FileManifest.load(tmp_path / "files/kv").files
        for nsid in (1, 2):
            ns = f"{sub}/namespaces/{nsid}"
            # The identity recorded with the file when it was made.
            assert target.fs.read(f"{ns}/device_uuid") == manifest[f"{host}/ns{nsid}.img"].uuid
            assert target.fs.read(f"{ns}/device_path") == str(
                tmp_path / f"files/kv/{host}/ns{nsid}.img")
            assert target.fs.read(f"{ns}/enable") == "1"
    assert sorted(e.name for e in target.fs.list("ports/1/subsystems")) == [
        nqn("gpu-1"), nqn("gpu-2")]
    records = TargetRecords.load(tmp_path / "state")
    assert records.ports == {1} and records.hosts == {H1, H2}
    assert {n: p.to_json() for n, p in records.pools.items()} == {
        "kv": {"kind": "file", "directory": str(tmp_path / "files")}}
    assert (records.node, records.nqn_prefix) == ("stor", "nqn.2026-11.io.kvagent")
    assert {(b.nqn, b.nsid) for b in records.bindings.values()} == {
        (nqn(h), n) for h in ("gpu-1", "gpu-2") for n in (1, 2)}

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
    records = TargetRecords.load(tmp_path / "state")
    assert "kv" in records.pools, "kept for pool destroy"
    assert not records.pool_bindings("kv"), "unexported: the identities are free again"


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
        assert not TargetRecords.load(tmp_path / "state").claims
    # The other pool applied.
    assert target.fs.exists(f"subsystems/{nqn('gpu-1', 'fine')}/namespaces/2")
    assert not [e for e in target.fs.list("subsystems") if ":whole" in e.name or
                ":carved" in e.name]


def test_a_grow_killed_before_nvmet_heard_of_it_is_revalidated_later(
        target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between growing the files and telling nvmet: the next pass tells it."""
    hosts = (("gpu-1", H1),)
    assert target.run(config(tmp_path, [file_pool(tmp_path, hosts=hosts)])).ok

    class Killed(BaseException):
        pass

    def killed(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise Killed

    bigger = config(tmp_path, [file_pool(tmp_path, size="8MiB", hosts=hosts)])
    with monkeypatch.context() as mp:
        mp.setattr(reconcile.TargetPass, "_apply", killed)
        with pytest.raises(Killed):
            target.run(bigger)
    assert (tmp_path / "files/kv/gpu-1/ns1.img").stat().st_size == 8 * MIB
    later = target.run(bigger)
    assert later.ok, later.errors
    sub = f"subsystems/{nqn('gpu-1')}"
    assert {p for _, p in target.ops("write")} == {
        f"{sub}/namespaces/1/revalidate_size", f"{sub}/namespaces/2/revalidate_size"}
    assert target.run(bigger).configfs_writes == 0


def test_a_subsystem_left_half_made_gets_its_model_and_serial(target: Target,
                                                              tmp_path: Path) -> None:
    """A pass killed right after creating a subsystem left the kernel's model and random
    serial; nobody can have identified it (it is in no port), so the next pass sets
    them. Once linked into a port they are left alone (the kernel may have fixed them)."""
    from agent.target.export import serial_for

    cfg = config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])
    sub = f"subsystems/{nqn('gpu-1')}"
    target.fs.mkdir(sub)
    assert target.fs.read(f"{sub}/attr_model") == "Linux"
    first = target.run(cfg)
    assert first.ok, first.errors
    assert target.fs.read(f"{sub}/attr_model") == "kvagent"
    assert target.fs.read(f"{sub}/attr_serial").strip() == serial_for(nqn("gpu-1"))
    # Linked now: a model written by someone else since is not fought over.
    target.fs.start_session()
    target.fs.write(f"{sub}/attr_model", "Other")
    again = target.run(cfg)
    assert again.ok and target.ops("write", f"{sub}/attr_") == []
    assert target.fs.read(f"{sub}/attr_model") == "Other"
