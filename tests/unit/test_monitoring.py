"""monitoring/: Prometheus rules (promtool check and unit tests) and the Grafana dashboard.

promtool comes from Debian's prometheus package (scripts/setup puts it in .venv/bin).
Without it these tests FAIL with a message; they never skip.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.health.metrics import build_registry
from tests import metricnames
from tests.unit.health import samples

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
RULES = MONITORING / "kvagent.rules.yml"
TESTS = sorted((MONITORING / "tests").glob("*.yml"))
OPERATIONS = REPO / "docs" / "operations.md"


def promtool() -> str:
    for candidate in (Path(sys.executable).parent / "promtool", shutil.which("promtool")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail("promtool is missing: run scripts/setup (it takes promtool from Debian's "
                "prometheus package); the rule tests must not be skipped")


def run_promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for r in metricnames.rules() if "alert" in r}


# --- promtool ---------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(metricnames.rules())} rules found" in result.stdout


def test_promtool_rule_tests_pass() -> None:
    assert TESTS, "no promtool tests in monitoring/tests"
    result = run_promtool("test", "rules", *map(str, TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("old", "new"), [
    ('up{job="kvagent"} == 0\n        for: 5m', 'up{job="kvagent"} == 0\n        for: 1m'),
    ("last_tick_timestamp_seconds > 600", "last_tick_timestamp_seconds > 6000"),
    ("kvagent_apply_busy_passes >= 10", "kvagent_apply_busy_passes >= 5"),
    ("kvagent_initiator_mounts_shut_down > 0\n        for: 10m",
     "kvagent_initiator_mounts_shut_down > 0\n        for: 20m"),
])
def test_promtool_tests_catch_a_changed_rule(tmp_path: Path, old: str, new: str) -> None:
    """The rule tests are not vacuous: a rule with another delay or threshold fails them."""
    copy = tmp_path / "monitoring"
    shutil.copytree(MONITORING, copy)
    text = (copy / RULES.name).read_text()
    assert text.count(old) == 1, old
    (copy / RULES.name).write_text(text.replace(old, new))
    result = run_promtool("test", "rules", *[str(copy / "tests" / t.name) for t in TESTS])
    assert result.returncode != 0, result.stdout
    assert "FAILED" in result.stdout + result.stderr


def test_every_alert_is_quiet_then_fires_then_resolves_in_the_rule_tests() -> None:
    seen: dict[str, list[tuple[float, bool]]] = {}
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                minutes = _minutes(check["eval_time"])
                seen.setdefault(check["alertname"], []).append(
                    (minutes, bool(check.get("exp_alerts"))))
    for name in alerts():
        checks = sorted(seen.get(name, []))
        fired = [t for t, firing in checks if firing]
        assert fired, f"{name}: no promtool case where it fires"
        assert any(not firing and t < fired[0] for t, firing in checks), \
            f"{name}: no case showing it quiet before it fires"
        assert any(not firing and t > fired[-1] for t, firing in checks), \
            f"{name}: no case where it resolves after firing"
    assert set(seen) <= set(alerts()), f"tests for unknown alerts: {set(seen) - set(alerts())}"


def _minutes(text: str) -> float:
    m = re.fullmatch(r"(\d+)([smh])", text)
    assert m, text
    return int(m.group(1)) * {"s": 1 / 60, "m": 1, "h": 60}[m.group(2)]


# --- alert metadata and runbooks --------------------------------------------------------


def _github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub (and most renderers) make for the document's headings."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_alert_has_a_runbook_section_in_operations() -> None:
    anchors = _github_anchors(OPERATIONS.read_text())
    for name, rule in alerts().items():
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/operations.md#{name.lower()}", (name, url)
        assert name.lower() in anchors, f"docs/operations.md has no section '### {name}'"


def test_every_alert_has_severity_summary_and_description() -> None:
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"].strip(), name
        assert rule["annotations"]["description"].strip(), name


def test_monitoring_readme_lists_every_alert_as_it_is() -> None:
    readme = (MONITORING / "README.md").read_text()
    for name, rule in alerts().items():
        row = next((line for line in readme.splitlines() if line.startswith(f"| {name} |")),
                   None)
        assert row, f"monitoring/README.md has no row for {name}"
        assert f"`{rule['expr']}`" in row, (name, rule["expr"], row)
        assert f"| {rule.get('for', '—')} | {rule['labels']['severity']} |" in row, row


def test_the_issue_s_alerts_are_all_there() -> None:
    """What an operator must act on (issue 17): each has an alert."""
    expected = {"KvagentPoolDegraded", "KvagentPoolFailed", "KvagentControllerNotLive",
                "KvagentConnectFailing", "KvagentEngineOverCap", "KvagentDriveCriticalWarning",
                "KvagentApplyFailing", "KvagentApplyBusy", "KvagentDown", "KvagentStale"}
    assert expected <= set(alerts())


# --- metric names ---------------------------------------------------------------------


def exporter_names() -> set[str]:
    """Every sample name the exporter renders for snapshots that fill every family."""
    healthy = samples.healthy()
    target = healthy.pools[0]
    assert target.target is not None
    full = dataclasses.replace(healthy, pools=(
        dataclasses.replace(target, target=dataclasses.replace(target.target,
                                                               hosts_connected=1)),
        *healthy.pools[1:]))
    names: set[str] = set()
    for snap in (full, samples.degraded()):
        text = generate_latest(build_registry(lambda s=snap: s, process=True)).decode()
        for family in text_string_to_metric_families(text):
            names.update(sample.name for sample in family.samples)
    return names


def test_every_metric_name_in_rules_and_dashboard_is_exported() -> None:
    exported = exporter_names()
    missing = {name: sorted(where) for name, where in metricnames.used_names().items()
               if name in metricnames.exported_names_used()
               and name not in exported}
    assert not missing, f"used but not exported by agent/health/metrics.py: {missing}"


def test_the_name_check_sees_a_name_the_exporter_lacks(tmp_path: Path, monkeypatch) -> None:
    """Not vacuous: a dashboard query on a made-up metric is reported."""
    dash = json.loads(metricnames.DASHBOARD.read_text())
    dash["panels"][1]["targets"][0]["expr"] = "sum(kvagent_made_up_bytes)"
    planted = tmp_path / "kvagent.json"
    planted.write_text(json.dumps(dash))
    monkeypatch.setattr(metricnames, "DASHBOARD", planted)
    assert "kvagent_made_up_bytes" in metricnames.exported_names_used()
    assert "kvagent_made_up_bytes" not in exporter_names()


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (instance, state) (kvagent_pool_state{state="ok"})', {"kvagent_pool_state"}),
    ("increase(kvagent_drive_media_errors_total{instance=~\"$instance\"}[1h]) > 0",
     {"kvagent_drive_media_errors_total"}),
    ("kvagent_engine_used_bytes / on (pool) group_left kvagent_engine_capacity_bytes > 1e9",
     {"kvagent_engine_used_bytes", "kvagent_engine_capacity_bytes"}),
    ("count(kvagent_last_apply_success == 0) or vector(0)", {"kvagent_last_apply_success"}),
    ("time() - kvagent:loop_tick_age:seconds offset 5m", {"kvagent:loop_tick_age:seconds"}),
])
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    assert metricnames.metric_names(expr) == names


def test_dashboard_and_rules_use_names() -> None:
    """The extraction finds the expected bulk of names (guards against a silent no-op)."""
    used = metricnames.used_names()
    assert len(used) > 30
    assert "dashboard" in used["kvagent_pool_state"]
    assert "rule KvagentPoolFailed" in used["kvagent_pool_state"]


# --- the dashboard --------------------------------------------------------------------


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses every dashboard query (as a recording rule, variables filled in)."""
    exprs = list(metricnames.dashboard_exprs())
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": re.sub(r"\$\w+", ".*", e)}
        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(metricnames.DASHBOARD.read_text())
    assert dash["uid"] == "kvagent" and dash["title"] == "kvagent"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "pool"} <= variables
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            assert target["expr"].count("{") == target["expr"].count("}"), target["expr"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
