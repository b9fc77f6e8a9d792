"""Status JSON against its schema, the text table, and exit codes."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from agent.health.snapshot import (
    ApplySummary,
    DriveHealth,
    PoolHealth,
    exit_code,
    host_problems,
    overall_state,
)
from agent.health.status import load_status_schema, render_status_text, to_status_json
from tests.unit.health import samples


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = load_status_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@pytest.mark.parametrize("make", [samples.healthy, samples.degraded, samples.empty],
                         ids=["healthy", "degraded", "empty"])
def test_status_json_matches_schema(validator, make) -> None:
    doc = to_status_json(make())
    validator.validate(doc)
    # What a script reads from stdout is plain JSON.
    assert json.loads(json.dumps(doc)) == doc


def test_schema_rejects_what_it_should(validator) -> None:
    good = to_status_json(samples.healthy())
    bad_state = {**good, "state": "fine"}
    extra = {**good, "surprise": 1}
    wrong_role = json.loads(json.dumps(good))
    wrong_role["pools"][0]["initiator"] = wrong_role["pools"][1]["initiator"]  # target pool
    for doc in (bad_state, extra, wrong_role):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(doc)


def test_status_json_content() -> None:
    doc = to_status_json(samples.healthy())
    assert doc["state"] == "ok" and doc["exit_code"] == 0 and doc["problems"] == []
    assert doc["taken_at"] == "2026-01-01T00:00:00Z"
    target, initiator = doc["pools"]
    assert target["target"]["hosts_connected"] is None
    assert target["initiator"] is None
    assert initiator["initiator"]["controllers"]["names"] == ["nvme1", "nvme2"]
    assert initiator["initiator"]["mount"]["free_bytes"] == 60 * samples.GIB
    assert initiator["probe"]["read_mib_s"] == 812.5
    assert doc["controllers"][0]["paths"] == [
        {"path": "nvme1c1n1", "nsid": 1, "ana_state": "optimized"}]
    assert doc["drives"][0]["temperature_celsius"] == 49.85
    assert doc["last_apply"]["finished_at"] == "2025-12-31T23:59:55Z"

    bad = to_status_json(samples.degraded())
    assert bad["state"] == "failed" and bad["exit_code"] == 1
    assert bad["drives"][0]["warnings"] == ["available spare below threshold",
                                            "reliability degraded"]
    assert bad["drives"][1]["healthy"] is False
    assert any("reload refused" in p for p in bad["problems"])


def test_text_rendering() -> None:
    text = render_status_text(samples.healthy())
    lines = text.splitlines()
    assert lines[0] == "node stor1: OK  (as of 2026-01-01T00:00:00Z)"
    assert "subsys 2/2  ns 4/4 enabled  ports 2/2 linked  hosts n/a" in text
    assert "ctrl 2/2 live  ns 2/2  /srv/kv  free 60.0GiB of 100.0GiB" in text
    assert any(line.split()[:3] == ["nvme1", "kv", "live"] for line in lines)
    assert "nvme1c1n1=optimized" in text
    assert "50°C" in text  # 49.85 °C, rounded for people
    assert "last apply: ok, 3 changed" in text
    assert "problems:" not in text

    bad = render_status_text(samples.degraded())
    assert bad.startswith("node gpu1: FAILED")
    assert "/srv/kv (not mounted)" in bad
    assert "connecting" in bad
    assert "last apply: FAILED (2 failed)" in bad
    assert "  - initiator pool kv: controller nvme1 is connecting" in bad
    assert "  - drive /dev/nvme1: smart-log unreadable: nvme smart-log timed out" in bad

    assert "no pools configured" in render_status_text(samples.empty())


def test_engine_over_cap_is_flagged_in_text() -> None:
    snap = samples.healthy()
    pool = snap.pools[1]
    assert pool.initiator is not None
    over = dataclasses.replace(pool.initiator, engines=(
        dataclasses.replace(pool.initiator.engines[0], used_bytes=50 * samples.GIB),))
    snap = dataclasses.replace(snap, pools=(dataclasses.replace(pool, initiator=over),))
    assert "OVER CAP" in render_status_text(snap)


def test_exit_codes() -> None:
    assert exit_code(samples.healthy()) == 0
    assert exit_code(samples.empty()) == 0
    assert exit_code(samples.degraded()) == 1
    base = samples.healthy()
    cases = {
        "degraded pool": dataclasses.replace(base, pools=(samples.target_pool(state="degraded"),)),
        "failed pool": dataclasses.replace(base, pools=(samples.target_pool(state="failed"),)),
        "drive warning": dataclasses.replace(base, drives=(samples.drive(critical_warning=2),)),
        "drive worn out": dataclasses.replace(base, drives=(samples.drive(percent_used=100),)),
        "drive unreadable": dataclasses.replace(
            base, drives=(DriveHealth(device="/dev/nvme0", error="timeout"),)),
        "apply failed": dataclasses.replace(
            base, last_apply=ApplySummary(finished_at=samples.T0, ok=False, failed=1)),
        "reload refused": dataclasses.replace(base, config_error="bad yaml"),
    }
    for why, snap in cases.items():
        assert exit_code(snap) == 1, why
        assert host_problems(snap), why
    assert overall_state(cases["failed pool"]) == "failed"
    assert overall_state(cases["drive warning"]) == "degraded"
    # Worn but below 100 % and media errors alone do not make a drive unhealthy.
    assert exit_code(dataclasses.replace(base, drives=(samples.drive(percent_used=99,
                                                                     media_errors=4),))) == 0


def test_pool_rejects_unknown_state_and_role() -> None:
    with pytest.raises(ValueError, match="state 'sad'"):
        PoolHealth(role="target", name="kv", state="sad", ready=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="role 'both'"):
        PoolHealth(role="both", name="kv", state="ok", ready=True)  # type: ignore[arg-type]


def test_unknown_critical_warning_bits_are_reported() -> None:
    d = samples.drive(critical_warning=0x81)
    assert d.warnings == ("available spare below threshold",)
    assert "critical warning bits 0x80" in d.problems


def test_a_shut_down_filesystem_and_its_recoveries(validator) -> None:
    snap = samples.shut_down()
    doc = to_status_json(snap)
    validator.validate(doc)
    (pool,) = doc["pools"]
    assert pool["initiator"]["mount"]["shut_down"] == ["/srv/kv/stor1-ns1"]
    assert pool["initiator"]["recoveries"] == {"count": 3, "last_at": "2025-12-31T23:00:00Z"}
    assert doc["state"] == "degraded" and any("shut down" in p for p in doc["problems"])
    healthy = to_status_json(samples.healthy())["pools"][1]["initiator"]
    assert healthy["mount"]["shut_down"] == [] and healthy["recoveries"] == {
        "count": 0, "last_at": None}
    text = render_status_text(snap)
    assert "xfs SHUT DOWN on 1  recovered 3x" in text
    assert "  - initiator pool kv: filesystem shut down after I/O errors" in text
    wrong = json.loads(json.dumps(doc))
    wrong["pools"][0]["initiator"]["mount"]["shut_down"] = "/srv/kv/stor1-ns1"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(wrong)
