"""The shipped alert rules and dashboard (deploy/) against what the code exports.

* ``promtool check rules`` and ``promtool test rules`` (the unit tests in
  deploy/prometheus/vpay-rules.test.yml) when promtool is on PATH (Debian's
  ``prometheus`` package ships it).
* Always: every rule is complete (severity, summary, description, a
  ``runbook_url`` to a section that exists in docs/runbooks/), and every
  metric name in a rule's or a dashboard panel's expression is one that
  ``vpay.base.metrics`` exports, read from its registry (not a hand list).
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vpay.base import metrics
from vpay.money import gauges

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "vpay-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "vpay-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "vpay-dashboard.json"
OBSERVABILITY_DOC = ROOT / "docs" / "observability.md"

# What the issue asks the rules to cover (alert name -> what it means).
REQUIRED_ALERTS = {"VpayLeaseLost", "VpayJobDeadLettered", "VpayChargesUnresolved",
                   "VpayRailContradiction", "VpayPollLate", "VpayRailErrors",
                   "VpayWebhookEndpointDisabled"}

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
             "gauge": ("",), "summary": ("", "_count", "_sum"), "info": ("_info",)}


def exported_families() -> dict[str, str]:
    """``{family name: type}`` of everything vpay exports: the registry's
    in-process metrics and the database collector's gauges."""
    families = {f.name: f.type for f in metrics.REGISTRY.collect()}
    families |= {f.name: f.type for f in gauges.DatabaseCollector().describe()}
    return families


def exported_series() -> set[str]:
    """Every sample name a scrape can show."""
    return {name + suffix for name, kind in exported_families().items() for suffix in _SUFFIXES[kind]}


# PromQL words that are not metric names: functions are followed by "(", so
# only aggregation operators, keywords and modifiers need listing.
_KEYWORDS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
             "bottomk", "topk", "quantile", "by", "without", "on", "ignoring", "group_left",
             "group_right", "and", "or", "unless", "offset", "bool", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside
    strings, label matchers, ranges and grouping clauses that are not
    functions or keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)   # strings
    text = re.sub(r"\{[^}]*\}", " ", text)                                  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                                 # ranges, subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"(?<![A-Za-z0-9_:])\d+(?:\.\d+)?(?:ms|[smhdwy])*", " ", text)  # numbers, durations
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def _rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def _slug(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


# --- the checker itself --------------------------------------------------------


def test_the_name_parser_finds_names_and_skips_functions_labels_and_keywords():
    expr = ('histogram_quantile(0.99, sum by (lane, le) (rate(vpay_poll_lateness_seconds_bucket'
            '{lane=~"mtn|orange"}[5m]))) > 5 and on (lane) max by (lane) (vpay_queue_jobs offset 1h)'
            ' / ignoring(state) vpay_nope_total')
    assert metric_names(expr) == {"vpay_poll_lateness_seconds_bucket", "vpay_queue_jobs", "vpay_nope_total"}


def test_exported_names_come_from_the_registry():
    series = exported_series()
    assert {"vpay_jobs_total", "vpay_job_seconds_bucket", "vpay_poll_lateness_seconds_count",
            "vpay_rail_requests_total", "vpay_rail_request_seconds_sum", "vpay_queue_jobs",
            "vpay_leases_lost_total", "vpay_leases_reaped_total", "vpay_alerts_open", "vpay_charges",
            "vpay_webhook_attempts_total", "vpay_webhook_endpoints_disabled"} <= series
    assert "vpay_jobs" not in series and "vpay_queue_jobs_total" not in series


# --- the rules -----------------------------------------------------------------


def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    # Debian's prometheus package has promtool; .ci/run installs it and sets
    # VPAY_REQUIRE_PROMTOOL=1, elsewhere its absence skips with one line.
    if shutil.which("promtool") is None:
        if os.environ.get("VPAY_REQUIRE_PROMTOOL") == "1":
            pytest.fail("VPAY_REQUIRE_PROMTOOL=1 but promtool is missing (apt-get install prometheus)")
        pytest.skip("promtool is not installed")
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True,
                            text=True, timeout=120, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_rule_is_complete_and_links_a_runbook_section_that_exists():
    rules = _rules()
    assert REQUIRED_ALERTS <= {r["alert"] for r in rules}
    for rule in rules:
        name = rule.get("alert")
        assert name and re.fullmatch(r"Vpay[A-Za-z]+", name), rule
        assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), name
        assert rule.get("labels", {}).get("severity") in ("warning", "critical"), name
        notes = rule.get("annotations", {})
        assert notes.get("summary") and notes.get("description"), name
        path, _, anchor = notes["runbook_url"].partition("#")
        assert path.startswith("docs/runbooks/") and anchor, name
        page = ROOT / path
        assert page.is_file(), f"{name}: {path} does not exist"
        headings = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", page.read_text(), re.MULTILINE)}
        assert anchor in headings, f"{name}: no section #{anchor} in {path}"
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), name


def test_every_metric_in_a_rule_is_exported():
    series = exported_series()
    for rule in _rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= series, f"{rule['alert']} uses {sorted(names - series)}, not exported"


# --- the dashboard -------------------------------------------------------------


def test_every_dashboard_query_uses_exported_metrics():
    series = exported_series()
    exprs = _dashboard_exprs()
    assert exprs
    used = set()
    for title, expr in exprs:
        names = metric_names(expr)
        assert names, title
        assert names <= series, f"panel {title!r} uses {sorted(names - series)}, not exported"
        used |= names
    # every family has a panel
    families = exported_families()
    for family, kind in families.items():
        assert any(name.startswith(family) for name in used), f"no panel shows {family}"


def test_observability_doc_describes_every_metric_and_alert():
    text = OBSERVABILITY_DOC.read_text()
    for family, kind in exported_families().items():
        shown = family + ("_total" if kind == "counter" else "")
        assert f"`{shown}" in text, f"docs/observability.md does not describe {shown}"
    for rule in _rules():
        assert rule["alert"] in text, f"docs/observability.md does not explain {rule['alert']}"
