"""A volume group kvagent was killed making is finished, never taken over (issue 24, item 12).

A killed ``vgcreate`` left PVs labelled in no group, which every later apply refused for
good ("LVM2_member signature"): there was no record that kvagent had written them. Now an
intent record names the group, the devices and the PV uuid of each label before any is
written; the next apply finishes the group when each label is exactly the one recorded.
A label without a record — or a record kvagent would not have written — is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.records import SCHEMA
from agent.system.run import CommandResult
from agent.target.backings import lvm, lvm_intent
from agent.target.backings.lvm_intent import intent_path, read_intent
from agent.target.safety import DeviceInspection, refusal
from tests.unit.fakerunner import FakeRunner

from .helpers import context, one_pool_config, plan_of

GIB = 1 << 30
DEVS = ("/dev/disk/by-id/a", "/dev/disk/by-id/b")
NODES = {"/dev/disk/by-id/a": "/dev/sda", "/dev/disk/by-id/b": "/dev/sdb"}
UUID = "AbCdEf-0123-4567-89ab-cdEF-ghij-KLmnOp"


class FakeLvm:
    """Devices, the PV labels on them and the groups they are in, as LVM and wipefs see
    them; pvcreate labels, vgcreate groups (and refuses a group that exists)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.labels: dict[str, tuple[str, str]] = {}  # node -> (pv uuid, vg)
        self.lvs: list[dict[str, str]] = []
        self.runner = (FakeRunner().on_call(["lvs"], self._lvs).on_call(["vgs"], self._vgs)
                       .on_call(["pvs"], self._pvs).on_call(["pvcreate"], self._pvcreate)
                       .on_call(["vgcreate"], self._vgcreate)
                       .on_call(["lvcreate"], self._lvcreate))
        monkeypatch.setattr(lvm, "inspect_device", self.inspect, raising=False)
        monkeypatch.setattr(lvm, "ensure_blank", self.ensure_blank)
        monkeypatch.setattr(lvm, "device_bytes", lambda dev, sysfs: 10 * GIB)
        monkeypatch.setattr(lvm.os.path, "realpath", lambda p: NODES.get(p, p))

    @staticmethod
    def _ok(argv: tuple[str, ...], data: object = "") -> CommandResult:
        return CommandResult(argv, 0, data if isinstance(data, str) else json.dumps(data), "")

    @staticmethod
    def _group(name: str) -> dict[str, str]:
        return {"vg_name": name, "vg_size": str(20 * GIB), "vg_free": str(10 * GIB),
                "vg_extent_size": str(4 << 20), "vg_tags": "kvagent"}

    def _lvs(self, argv, _input):  # type: ignore[no-untyped-def]
        return self._ok(argv, {"report": [{"lv": self.lvs}]})

    def _vgs(self, argv, _input):  # type: ignore[no-untyped-def]
        groups = sorted({vg for _, vg in self.labels.values() if vg})
        return self._ok(argv, {"report": [{"vg": [self._group(g) for g in groups]}]})

    def _lvcreate(self, argv, _input):  # type: ignore[no-untyped-def]
        name, vg = argv[argv.index("-n") + 1], argv[-2]
        tags = ",".join(argv[i + 1] for i, a in enumerate(argv) if a == "--addtag")
        self.lvs.append({"lv_name": name, "vg_name": vg, "lv_path": f"/dev/{vg}/{name}",
                         "lv_size": str(GIB), "lv_uuid": name, "lv_tags": tags,
                         **self._group(vg)})
        return self._ok(argv)

    def _pvs(self, argv, _input):  # type: ignore[no-untyped-def]
        return self._ok(argv, {"report": [{"pv": [
            {"pv_name": n, "pv_uuid": u, "vg_name": g} for n, (u, g) in self.labels.items()]}]})

    def _pvcreate(self, argv, _input):  # type: ignore[no-untyped-def]
        node = argv[-1]
        assert node not in self.labels, f"pvcreate over an existing label on {node}"
        self.labels[node] = (argv[argv.index("--uuid") + 1], "")
        return self._ok(argv)

    def _vgcreate(self, argv, _input):  # type: ignore[no-untyped-def]
        vg, nodes = argv[4], argv[5:]
        assert all(self.labels.get(n, ("", ""))[1] == "" for n in nodes)
        for n in nodes:
            self.labels[n] = (self.labels.get(n, ("generated", ""))[0], vg)
        return self._ok(argv)

    def inspect(self, path: str, runner) -> DeviceInspection:  # type: ignore[no-untyped-def]
        node = NODES[path]
        found = ("LVM2_member signature at offset 0x218",) if node in self.labels else ()
        return DeviceInspection(path, node, found)

    def ensure_blank(self, path: str, purpose: str, runner) -> str:  # type: ignore[no-untyped-def]
        found = self.inspect(path, runner)
        if not found.blank:
            raise refusal(found, purpose)
        return found.device

    def ran(self, program: str) -> list[tuple[str, ...]]:
        return self.runner.ran(program)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeLvm:
    return FakeLvm(monkeypatch)


def cfg(tmp_path: Path, devices: tuple[str, ...] = DEVS):  # type: ignore[no-untyped-def]
    return one_pool_config({"kind": "lvm", "volume_group": "new", "devices": list(devices)},
                           state_dir=tmp_path / "state", namespaces={"count": 1, "size": "1GiB"})


def plan(tmp_path: Path, fake: FakeLvm, **kw):  # type: ignore[no-untyped-def]
    c = cfg(tmp_path, **kw)
    return plan_of(c, context(c, fake.runner))


def run_until(p, kind: str, count: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Run the plan's steps up to (not including) the ``count``-th of ``kind``: a pass
    killed just before it."""
    for step in p.steps:
        if step.kind == kind:
            count -= 1
            if count == 0:
                return
        step.run()


def kinds(p) -> list[str]:  # type: ignore[no-untyped-def]
    return [s.kind for s in p.steps]


@pytest.mark.parametrize(("killed_before", "count", "still_to_label"), [
    ("lvm.vgcreate", 1, 0),   # every device labelled, no group: the case
    ("lvm.pvcreate", 2, 1),   # one labelled, one blank
    ("lvm.pvcreate", 1, 2),   # only the intent recorded
])
def test_a_killed_vgcreate_is_finished_by_the_next_apply(tmp_path: Path, fake: FakeLvm,
                                                         killed_before: str, count: int,
                                                         still_to_label: int) -> None:
    first = plan(tmp_path, fake)
    assert kinds(first) == ["lvm.intent", "lvm.pvcreate", "lvm.pvcreate", "lvm.vgcreate",
                            "lvm.lvcreate"]
    run_until(first, killed_before, count)
    intent = read_intent(tmp_path / "state", "new")
    assert intent is not None and intent.paths == DEVS and intent.pool == "kv"
    assert {u for u, _ in fake.labels.values()} <= {pv.pv_uuid for pv in intent.pvs}
    # What labels there are kvagent's: a plain blank check refuses them.
    assert len(fake.labels) == 2 - still_to_label

    again = plan(tmp_path, fake)
    assert not again.errors, again.errors
    assert kinds(again) == ["lvm.pvcreate"] * still_to_label + ["lvm.vgcreate", "lvm.lvcreate"]
    for step in again.steps:
        step.run()
    assert {fake.labels[n] for n in ("/dev/sda", "/dev/sdb")} == {
        (pv.pv_uuid, "new") for pv in intent.pvs}, "each label is the one recorded"
    assert not intent_path(tmp_path / "state", "new").exists(), "the intent goes with vgcreate"


def test_the_intent_is_recorded_before_any_label_and_is_private(tmp_path: Path,
                                                                fake: FakeLvm) -> None:
    first = plan(tmp_path, fake)
    first.steps[0].run()
    assert fake.ran("pvcreate") == []
    path = intent_path(tmp_path / "state", "new")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and data["kind"] == "vgcreate"
    assert [pv["path"] for pv in data["pvs"]] == list(DEVS)
    first.steps[1].run()
    (argv,) = fake.ran("pvcreate")
    assert argv == ("pvcreate", "-y", "--uuid", data["pvs"][0]["pv_uuid"], "--norestorefile",
                    "/dev/sda")


def test_a_label_without_an_intent_is_still_refused(tmp_path: Path, fake: FakeLvm) -> None:
    fake.labels["/dev/sda"] = (UUID, "")
    p = plan(tmp_path, fake)
    assert p.steps == [] and fake.ran("pvcreate") == [] == fake.ran("vgcreate")
    (error,) = p.errors
    assert "refusing to create volume group on /dev/disk/by-id/a (/dev/sda)" in error
    assert "LVM2_member signature" in error and "wipefs -a /dev/sda" in error


@pytest.mark.parametrize("label", [("OtherU-uuid-0000-0000-0000-0000-000000", ""),
                                   ("SAME", "othervg")])
def test_an_intent_never_adopts_a_label_it_did_not_write(tmp_path: Path, fake: FakeLvm,
                                                         label: tuple[str, str]) -> None:
    """The record names the PV uuid kvagent gave its label: a label someone else wrote
    (another uuid), or one already in a group, is refused with both named."""
    run_until(plan(tmp_path, fake), "lvm.pvcreate")
    intent = read_intent(tmp_path / "state", "new")
    assert intent is not None
    recorded = intent.pvs[0].pv_uuid
    fake.labels["/dev/sda"] = (recorded if label[0] == "SAME" else label[0], label[1])
    p = plan(tmp_path, fake)
    assert p.steps == [] and fake.ran("pvcreate") == [] == fake.ran("vgcreate")
    (error,) = p.errors
    assert "refusing to create volume group on /dev/disk/by-id/a" in error
    assert f"intent record names PV {recorded} in no group" in error
    assert "not the label kvagent wrote" in error
    if label[1]:
        assert "in volume group 'othervg'" in error
    else:
        assert label[0] in error


def test_an_intent_for_other_devices_is_not_finished_elsewhere(tmp_path: Path,
                                                               fake: FakeLvm) -> None:
    run_until(plan(tmp_path, fake), "lvm.vgcreate")
    p = plan(tmp_path, fake, devices=DEVS[:1])
    assert p.steps == [] and fake.ran("vgcreate") == []
    (error,) = p.errors
    where = intent_path(tmp_path / "state", "new")
    assert f"intent record {where} says it was making volume group new for pool kv" in error
    assert ", ".join(DEVS) in error and "pvremove" in error


def test_a_made_group_forgets_a_leftover_intent(tmp_path: Path, fake: FakeLvm) -> None:
    """Killed after vgcreate, before the record went: the next pass removes it."""
    first = plan(tmp_path, fake)
    run_until(first, "lvm.vgcreate")
    path = intent_path(tmp_path / "state", "new")
    left = path.read_bytes()
    for step in first.steps[3:]:
        step.run()
    assert not path.exists() and plan(tmp_path, fake).steps == []
    path.write_bytes(left)
    p = plan(tmp_path, fake)
    assert kinds(p) == ["lvm.intent"] and not p.errors
    p.steps[0].run()
    assert not path.exists()
    assert plan(tmp_path, fake).steps == []


# ------------------------------------------------------------ hostile records
def valid() -> dict:  # type: ignore[type-arg]
    return {"schema": SCHEMA, "kind": "vgcreate", "volume_group": "new", "pool": "kv",
            "pvs": [{"path": DEVS[0], "pv_uuid": UUID},
                    {"path": DEVS[1], "pv_uuid": UUID.replace("A", "Z")}]}


def put(tmp_path: Path, data: object, mode: int = 0o600) -> Path:
    path = intent_path(tmp_path / "state", "new")
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    path.chmod(mode)
    return path


HOSTILE = {
    "extra key": lambda d: {**d, "temp": "../../etc/shadow"},
    "missing key": lambda d: {k: v for k, v in d.items() if k != "pool"},
    "other group": lambda d: {**d, "volume_group": "vg0"},
    "other kind": lambda d: {**d, "kind": "lvremove"},
    "schema 1": lambda d: {**d, "schema": 1},
    "schema true": lambda d: {**d, "schema": True},
    "pool path": lambda d: {**d, "pool": "../kv"},
    "relative device": lambda d: {**d, "pvs": [{"path": "../../dev/sda", "pv_uuid": UUID}]},
    "device outside /dev": lambda d: {**d, "pvs": [{"path": "/etc/passwd", "pv_uuid": UUID}]},
    "dotdot device": lambda d: {**d, "pvs": [{"path": "/dev/../etc/passwd", "pv_uuid": UUID}]},
    "bad uuid": lambda d: {**d, "pvs": [{"path": DEVS[0], "pv_uuid": "x; rm -rf /"}]},
    "uuid twice": lambda d: {**d, "pvs": [{"path": p, "pv_uuid": UUID} for p in DEVS]},
    "no devices": lambda d: {**d, "pvs": []},
    "extra device key": lambda d: {**d, "pvs": [{"path": DEVS[0], "pv_uuid": UUID,
                                                 "node": "/dev/sdz"}]},
    "not json": lambda d: "{not json",
    "a list": lambda d: [d],
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_record_kvagent_would_not_write_is_refused(tmp_path: Path, fake: FakeLvm,
                                                     name: str) -> None:
    path = put(tmp_path, HOSTILE[name](valid()))
    fake.labels["/dev/sda"] = (UUID, "")
    p = plan(tmp_path, fake)
    assert p.steps == [] and fake.ran("pvcreate") == [] == fake.ran("vgcreate")
    (error,) = p.errors
    assert f"{path} is not an intent record kvagent writes" in error
    assert f"rm {path}" in error
    assert fake.labels == {"/dev/sda": (UUID, "")}


def test_the_valid_record_of_these_tests_is_finished(tmp_path: Path, fake: FakeLvm) -> None:
    """The control of the hostile cases: the same record, unaltered, is acted on."""
    put(tmp_path, valid())
    fake.labels["/dev/sda"] = (UUID, "")
    p = plan(tmp_path, fake)
    assert not p.errors and kinds(p) == ["lvm.pvcreate", "lvm.vgcreate", "lvm.lvcreate"]


@pytest.mark.parametrize("place", ["open record", "symlinked record", "fifo",
                                   "open directory", "symlinked directory"])
def test_records_in_a_place_kvagent_does_not_trust_are_not_read(tmp_path: Path, fake: FakeLvm,
                                                                place: str) -> None:
    """The record (or its directory) writable by others, a symlink, not a regular file:
    refused with the path and the fix, though what it says would be acted on."""
    fake.labels["/dev/sda"] = (UUID, "")
    path = put(tmp_path, valid())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    put(tmp_path, valid()).rename(elsewhere / path.name)
    path = put(tmp_path, valid())
    expect = {"open record": "another user could write", "symlinked record": "is a symlink",
              "fifo": "not a regular file", "open directory": "another user could write",
              "symlinked directory": "is a symlink or not a directory"}[place]
    if place == "open record":
        path.chmod(0o666)
    elif place == "symlinked record":
        path.unlink()
        path.symlink_to(elsewhere / path.name)
    elif place == "fifo":
        path.unlink()
        os.mkfifo(path, 0o600)
    elif place == "open directory":
        path.parent.chmod(0o777)
    else:
        path.unlink()
        path.parent.rmdir()
        path.parent.symlink_to(elsewhere)
    p = plan(tmp_path, fake)
    assert p.steps == [] and fake.ran("pvcreate") == [] == fake.ran("vgcreate")
    (error,) = p.errors
    assert expect in error and str(path.parent) in error


def test_a_volume_group_name_cannot_name_another_file(tmp_path: Path) -> None:
    with pytest.raises(lvm_intent.IntentError, match="no intent record"):
        read_intent(tmp_path, "../target")
