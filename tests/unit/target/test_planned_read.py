"""The storage pass reads nvmet with the planner's read: only the files its plan needs, each
once, live every pass — a drift in any attribute it compares is seen and fixed alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nvmet
from agent.target import reconcile
from nvmet.fake import FakeConfigFS
from nvmet.readspec import ReadSpec

from .helpers import H1, Target, config, file_pool, nqn

#: Files kvagent's desired tree compares (per object kind), with a wrong value for each.
DRIFTS = {
    "namespace": {"enable": "0", "device_uuid": "11111111-2222-4333-8444-555555555555",
                  "device_nguid": "11111111-2222-4333-8444-555555555555",
                  "device_path": "/nowhere.img", "buffered_io": "1"},
    "subsystem": {"attr_allow_any_host": "1"},
    "port": {"addr_trsvcid": "4421", "addr_traddr": "127.0.0.2"},
    "ana_group": {"ana_state": "inaccessible"},
}


_CONVERGED: dict[Path, tuple[Any, FakeConfigFS]] = {}


def two_pools(tmp_path: Path):  # type: ignore[no-untyped-def]
    return config(tmp_path, [file_pool(tmp_path), file_pool(tmp_path, name="kv2", count=1,
                                                             hosts=(("gpu-1", H1),))])


def converged(target: Target, tmp_path: Path):  # type: ignore[no-untyped-def]
    cfg = two_pools(tmp_path)
    assert target.run(cfg).ok
    target.fs.add_device("/nowhere.img", "file")
    return cfg


def kind_and_file(path: str) -> tuple[str, str]:
    parts = path.split("/")
    kind = {("hosts", 3): "hosts", ("subsystems", 3): "subsystems",
            ("subsystems", 5): "namespaces", ("ports", 3): "ports",
            ("ports", 5): "ana_groups"}[(parts[0], len(parts))]
    return kind, parts[-1]


def test_a_converged_pass_reads_only_the_planners_files_each_once(
        target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = converged(target, tmp_path)
    more: list[ReadSpec] = []
    real_more = nvmet.read_more
    monkeypatch.setattr(nvmet, "read_more", lambda fs, live, have, want: (
        more.append(want - have), real_more(fs, live, have, want))[1])
    target.fs.files_read.clear()
    again = target.run(cfg)
    assert again.ok and not again.changed and again.configfs_writes == 0
    assert more == []  # the first read already had everything the plan compares
    spec = reconcile.base_spec(cfg, nvmet.features(target.fs))
    read = target.fs.files_read
    assert read and max(read.values()) == 1
    outside = [p for p in read if kind_and_file(p)[1] not in getattr(spec, kind_and_file(p)[0])]
    assert outside == []
    # Files a full read would have read, and this one did not: the subsystem's model and
    # serial, the namespaces' other attributes, the port's other parameters.
    full = FakeConfigFS.clone(target.fs)
    nvmet.read(full)
    skipped = set(full.files_read) - set(read)
    assert {f"subsystems/{nqn('gpu-1')}/attr_model",
            f"subsystems/{nqn('gpu-1')}/namespaces/1/ana_grpid"} <= skipped
    # Exactly the compared files of every namespace, subsystem and port, nothing else.
    nss = [f"subsystems/{nqn(h, p)}/namespaces/{n}" for h, p, ns in (
        ("gpu-1", "kv", (1, 2)), ("gpu-2", "kv", (1, 2)), ("gpu-1", "kv2", (1,))) for n in ns]
    assert {p for p in read if "/namespaces/" in p} == {
        f"{ns}/{f}" for ns in nss for f in spec.namespaces}


def test_a_file_the_first_read_left_out_is_read_before_planning(
        target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first read is a guess from the config; whatever the desired tree compares beyond
    it is read (``read_more``) before planning, so a drift there is still seen."""
    cfg = converged(target, tmp_path)
    monkeypatch.setattr(reconcile, "base_spec", lambda cfg, feats: ReadSpec.planner())
    path = f"subsystems/{nqn('gpu-2')}/namespaces/2/device_uuid"
    good = target.fs.read(path)
    target.fs.poke(path, DRIFTS["namespace"]["device_uuid"])
    target.fs.files_read.clear()
    fixed = target.run(cfg)
    assert fixed.ok and target.fs.read(path) == good
    assert max(target.fs.files_read.values()) <= 2  # read, then read again after the fix
    assert not target.run(cfg).changed


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_drift_in_any_compared_attribute_is_seen_and_fixed_alone(
        target: Target, tmp_path: Path, data: st.DataObject) -> None:
    if tmp_path not in _CONVERGED:  # once per test: every example starts from a copy
        cfg = converged(target, tmp_path)
        _CONVERGED[tmp_path] = (cfg, target.fs.clone())
    cfg, base = _CONVERGED[tmp_path]
    target.fs = base.clone()
    kind = data.draw(st.sampled_from(sorted(DRIFTS)))
    name = data.draw(st.sampled_from(sorted(DRIFTS[kind])))
    sub = data.draw(st.sampled_from([nqn("gpu-1"), nqn("gpu-2"), nqn("gpu-1", "kv2")]))
    obj = {"subsystem": f"subsystems/{sub}", "port": "ports/1",
           "namespace": f"subsystems/{sub}/namespaces/1", "ana_group": "ports/1/ana_groups/1"}[kind]
    path = f"{obj}/{name}"
    good = target.fs.read(path)
    target.fs.poke(path, DRIFTS[kind][name])
    fixed = target.run(cfg)
    assert fixed.ok, fixed.errors
    assert target.fs.read(path) == good
    touched = {p for op, p in target.ops() if op != "read"}
    assert touched and all(p.startswith(obj) for p in touched), touched
    assert not target.run(cfg).changed
