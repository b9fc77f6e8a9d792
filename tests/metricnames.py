"""Metric names that monitoring/'s rules and dashboard use.

Shared by tests/unit/test_monitoring.py (against the exporter's own output) and
tests/kernel/test_deb_package.py (against a live agent's /metrics): both check that
every name used there is one kvagent really exports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

MONITORING = Path(__file__).resolve().parents[1] / "monitoring"
RULES = MONITORING / "kvagent.rules.yml"
DASHBOARD = MONITORING / "grafana" / "kvagent.json"

#: Series that Prometheus itself makes for every scrape target, not kvagent.
PROMETHEUS_MADE = frozenset({"up"})

_KEYWORDS = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
})
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a tokenizer, not a full parser).

    Drops strings, label matchers ``{...}``, ranges ``[...]``, grouping label lists
    (``by (...)``, ``on (...)``, ...), numbers, keywords and function names (an
    identifier followed by ``(``); what is left are the selected metric names.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables outside matchers
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        start = m.start()
        if start and (text[start - 1].isdigit() or text[start - 1] == "."):
            continue  # the exponent or unit of a number (1e9, 5m)
        if re.match(r"\s*\(", text[m.end():]) or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def rules() -> list[dict]:
    """Every rule (recording and alerting) of monitoring/kvagent.rules.yml."""
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    """Names the recording rules define (usable by alerts and the dashboard)."""
    return {r["record"] for r in rules() if "record" in r}


def dashboard_exprs() -> Iterator[str]:
    """Every PromQL expression of the Grafana dashboard: panel targets and variables."""
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for var in dash["templating"]["list"]:
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            yield m.group(1) if m else query


def used_names() -> dict[str, set[str]]:
    """Metric name -> where it is used ("rule NAME", "dashboard")."""
    used: dict[str, set[str]] = {}
    for rule in rules():
        where = f"rule {rule.get('alert') or rule.get('record')}"
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(where)
    for expr in dashboard_exprs():
        for name in metric_names(expr):
            used.setdefault(name, set()).add("dashboard")
    return used


def exported_names_used() -> set[str]:
    """Names used that kvagent's exporter must provide (not recorded, not Prometheus's)."""
    return set(used_names()) - recorded_names() - PROMETHEUS_MADE
