"""The alerting rules shipped in docs/alerts.yml: valid, firing when they should, on real names.

``promtool check rules`` and ``promtool test rules`` (the cases in
``alerts_test.yml`` beside this file) run for real; they are skipped only
where promtool is not installed (``make sysdeps`` installs it). Every
``llmgw_*`` series a rule reads must be one llmgw exposes: the names are
taken from the exposition of the router's instruments and the fleet
collector, not from a list kept by hand.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from ruamel.yaml import YAML

from llmgw.fleet.types import Fleet
from llmgw.metrics.collectors import FleetCollector, RolloutCollector
from llmgw.metrics.instruments import RouterMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "alerts.yml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")
SNAPSHOT = ROOT / "cluster.example" / "fleet-snapshot.json"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is not installed (make sysdeps)")


def exposed_names() -> set[str]:
    """Every series name llmgw's metrics listener can expose."""
    registry = CollectorRegistry()
    RouterMetrics(registry)
    collector = FleetCollector()
    collector.observe(Fleet.model_validate_json(SNAPSHOT.read_text()))
    registry.register(collector)
    registry.register(RolloutCollector(lambda: (["m"], {("m", "rolled_back"): 1})))
    names: set[str] = set()
    for line in generate_latest(registry).decode().splitlines():
        match = re.match(r"# TYPE (\S+) (\S+)", line)
        if match:
            name, kind = match.groups()
            names.add(name)
            if kind == "histogram":
                names.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
    return names


def rule_expressions() -> dict[str, str]:
    data = YAML(typ="safe").load(RULES.read_text())
    return {rule["alert"]: rule["expr"] for group in data["groups"] for rule in group["rules"]}


@needs_promtool
def test_promtool_accepts_the_rules_file() -> None:
    result = subprocess.run(["promtool", "check", "rules", str(RULES)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_expressions())} rules found" in result.stdout


@needs_promtool
def test_alerts_fire_on_the_series_that_should_trigger_them() -> None:
    result = subprocess.run(["promtool", "test", "rules", str(UNIT_TESTS)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("alert", sorted(rule_expressions()))
def test_every_series_a_rule_reads_is_exposed_by_llmgw(alert: str) -> None:
    used = set(re.findall(r"\bllmgw_[a-z0-9_]+", rule_expressions()[alert]))
    missing = used - exposed_names()
    assert not missing, f"{alert} reads series llmgw does not expose: {sorted(missing)}"
