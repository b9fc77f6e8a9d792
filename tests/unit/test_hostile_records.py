"""Hostile records (issue 24): every record kvagent reads back — target.json, the schema-1
device claims, initiator.json, last-apply.json, probe, quota and cleaner records, a file
pool's manifest, an LVM intent — planted as a symlink to a file outside, owned by another
user, writable by group or others, in a directory writable by others, or as a FIFO, is
refused with an error naming it; the file outside is never read into kvagent's state,
followed, truncated or written. Path-like fields set to ``..``, relative or unnormalized
paths are refused on load, and a trusted record's directory outside the pool is never
removed. (A manifest entry naming a path outside the pool: tests/unit/target/
test_file_links.py and the file backing's tests, issue 24 item 1.)"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.errors import KvagentError
from agent.initiator.reconcile import load_state
from agent.records import (
    FileManifest,
    InitiatorRecords,
    TargetRecords,
    cleaner_path,
    probes_path,
    quota_path,
    read_last_apply,
)
from agent.state import read_json
from agent.target.backings.lvm_intent import intent_path, read_intent

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="chown to another user needs root")

#: Valid-looking content for each kind (what the victim holds, and what a planted record
#: holds), so a refusal is for where and how it lies, not for what it says.
TARGET = {"schema": 2, "node": "n", "ports": [1], "hosts": [], "pools": {}, "claims": {},
          "bindings": []}


def kinds(state: Path, pool_dir: Path) -> dict[str, tuple[Path, Any, Callable[[], Any]]]:
    """Each record kind: (its path, content, the loader kvagent reads it with)."""
    return {
        "target.json": (state / "target.json", TARGET, lambda: TargetRecords.load(state)),
        "device-claims.json": (state / "device-claims.json", {},
                               lambda: TargetRecords.load(state)),
        "initiator.json": (state / "initiator.json", {"schema": 2, "pools": {}},
                           lambda: InitiatorRecords.load(state)),
        "last-apply.json": (state / "last-apply.json", {"ok": True},
                            lambda: read_last_apply(state)),
        "probes": (probes_path(state, "kv"), [], lambda: read_json(probes_path(state, "kv"),
                                                                   None)),
        "quota": (quota_path(state, "kv"), {}, lambda: read_json(quota_path(state, "kv"), {})),
        "cleaner": (cleaner_path(state, "kv"), {},
                    lambda: read_json(cleaner_path(state, "kv"), {})),
        "manifest": (pool_dir / ".kvagent-pool.json", {"schema": 2, "pool": "kv", "files": {}},
                     lambda: FileManifest.load(pool_dir)),
        "lvm-intent": (intent_path(state, "vg0"), {}, lambda: read_intent(state, "vg0")),
    }


def plant(path: Path, attack: str, content: Any, victim: Path) -> str:
    """Plant ``attack`` at ``path``; the words the refusal must contain."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    text = json.dumps(content)
    if attack == "symlink":
        victim.write_text(text)
        path.symlink_to(victim)
        return "link"
    if attack == "fifo":
        os.mkfifo(path)
        return "regular"
    path.write_text(text)
    os.chmod(path, 0o600)
    if attack == "other-owner":
        os.chown(path, 65534, 65534)
        return "65534"
    if attack == "group-writable":  # a group other than root's (root's group is root)
        os.chmod(path, 0o620)
        if ROOT:
            os.chown(path, 0, 100)
        return "writable"
    if attack == "directory-writable":
        os.chmod(path.parent, 0o777)
        return "writable"
    raise AssertionError(attack)


ATTACKS = ["symlink", "fifo", pytest.param("other-owner", marks=needs_root),
           "group-writable", "directory-writable"]
KINDS = ["target.json", "device-claims.json", "initiator.json", "last-apply.json", "probes",
         "quota", "cleaner", "manifest", "lvm-intent"]


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_record_is_refused_and_what_it_points_at_untouched(
        tmp_path: Path, kind: str, attack: str) -> None:
    state, pool_dir = tmp_path / "state", tmp_path / "files/kv"
    state.mkdir()
    pool_dir.mkdir(parents=True)
    victim = tmp_path / "outside/victim.json"
    victim.parent.mkdir()
    path, content, load = kinds(state, pool_dir)[kind]
    words = plant(path, attack, content, victim)
    before = victim.read_bytes() if victim.exists() else None
    outcome: list[BaseException | Any] = []
    reader = threading.Thread(target=lambda: outcome.append(_catch(load)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), f"reading a planted {kind} ({attack}) hangs"
    [error] = outcome
    assert isinstance(error, KvagentError), f"{kind} ({attack}) was read: {error!r}"
    text = f"{error.message} {error.hint or ''}"
    assert words in text, text
    assert str(path.parent) in text or str(path) in text, text
    if before is not None:
        assert victim.read_bytes() == before and not victim.is_symlink()
    assert os.path.islink(path) == (attack == "symlink")  # nothing replaced or removed


def _catch(load: Callable[[], Any]) -> Any:
    try:
        return load()
    except BaseException as exc:
        return exc


# ------------------------------------------------------------ path-like fields
def attachment(**changes: Any) -> dict[str, Any]:
    pool = {"hostnqn": "nqn.2014-08.org.example:h", "layout": "per-namespace",
            "devices": [{"subsysnqn": "s", "nsid": 1, "uuid": "u", "device": "/dev/nvme1n1",
                         "mount": "/srv/kv/ns1"}],
            "mounts": ["/srv/kv/ns1"], "created_dirs": ["/srv/kv", "/srv/kv/ns1"],
            "recoveries": [{"mount": "/srv/kv/ns1", "count": 1, "last_at": 0.0}]}
    for where, value in changes.items():
        field, _, sub = where.partition(".")
        if sub:
            pool[field][0][sub] = value
        else:
            pool[field] = [value]
    return {"schema": 2, "pools": {"kv": pool}}


HOSTILE_PATHS = ["../../etc", "relative/dir", "/srv/kv/../../etc", "/srv//kv", "/srv/kv/",
                 "/srv/kv\0/x", ""]
INITIATOR_FIELDS = ["mounts", "created_dirs", "devices.mount", "devices.device",
                    "recoveries.mount"]


@pytest.mark.parametrize("value", HOSTILE_PATHS)
@pytest.mark.parametrize("field", INITIATOR_FIELDS)
def test_an_initiator_path_field_out_of_shape_is_refused(tmp_path: Path, field: str,
                                                         value: str) -> None:
    (tmp_path / "initiator.json").write_text(json.dumps(attachment(**{field: value})))
    with pytest.raises(KvagentError) as caught:
        InitiatorRecords.load(tmp_path)
    assert str(tmp_path / "initiator.json") in caught.value.message


def test_the_initiator_record_in_shape_loads(tmp_path: Path) -> None:
    """The baseline of the test above: the same record with every field in shape."""
    (tmp_path / "initiator.json").write_text(json.dumps(attachment()))
    assert InitiatorRecords.load(tmp_path)["kv"].created_dirs == ["/srv/kv", "/srv/kv/ns1"]


# A binding's storage path may be relative (it is only compared): "dev/sda" is refused
# only in claims.
@pytest.mark.parametrize(("where", "value"), [
    (where, value) for where in ("binding", "claim-path", "claim-device")
    for value in ("../../etc/shadow", "dev/sda", "/dev/../etc/shadow")
    if not (where == "binding" and value == "dev/sda")])
def test_a_target_path_field_out_of_shape_is_refused(tmp_path: Path, where: str,
                                                     value: str) -> None:
    record = dict(TARGET)
    if where == "binding":
        record["bindings"] = [{"nqn": "n", "nsid": 1, "uuid": "u", "nguid": "g", "pool": "p",
                               "host": None, "storage": {"kind": "file", "path": value}}]
    else:
        path, device = ((value, "/dev/nvme0n1") if where == "claim-path"
                        else ("/dev/disk/by-id/x", value))
        record["claims"] = {path: {"pool": "p", "host": None, "device": device, "nsid": 1}}
    (tmp_path / "target.json").write_text(json.dumps(record))
    with pytest.raises(KvagentError) as caught:
        TargetRecords.load(tmp_path)
    assert str(tmp_path / "target.json") in caught.value.message


def test_a_recorded_directory_outside_the_pools_mounts_is_never_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trusted initiator.json whose ``created_dirs`` also names an empty directory that is
    no mount of the pool (nor above one): detach removes the pool's own and keeps that."""
    from tests.unit.initiator.test_attach_reconcile import host as _host  # noqa: F401
    from tests.unit.initiator.test_attach_reconcile import pool_yaml, run

    from .initiator.attach_fakes import Export, FakeHost
    from .initiator.test_attach_reconcile import NQN

    host = FakeHost(tmp_path, exports=[Export(NQN, [1, 2])])
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in host.mounts())
    assert run(host, pool_yaml(host)).ok
    victim = tmp_path / "home/someone/empty"
    victim.mkdir(parents=True)
    record = tmp_path / "state/initiator.json"
    data = json.loads(record.read_text())
    data["pools"]["kv"]["created_dirs"].append(str(victim))
    record.write_text(json.dumps(data))
    result = run(host)  # the pool left the config: detach
    assert result.ok, result.errors
    assert victim.is_dir(), "an empty directory outside the pool was removed"
    assert not (tmp_path / "mnt/kv").exists()  # the pool's own went
    assert load_state(tmp_path / "state") == {}
