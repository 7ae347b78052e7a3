"""The Grafana dashboards shipped in ``deploy/grafana``: their queries, as Grafana would send them.

Every ``deploy/grafana/*.json`` is read (a dashboard added there is covered
without a list to edit). :func:`queries` yields each target of each panel,
rows' nested panels included, with where it sits (file, panel, refId), so a
failure names the panel. :func:`render` substitutes what Grafana substitutes
before a query reaches Prometheus: ``$__rate_interval``, ``$__interval``,
``$__range`` and the dashboard's own variables, a multi-value one as the
regex alternation Grafana sends for it. :func:`exposed_names` is every series
name llmgw's metrics listener can expose, taken from the real instruments and
collectors, not from a list kept by hand.

Usage::

    for query in dashboards.queries():
        expr = dashboards.render(query.expr, {"node": ["gpu-01"]}, BUILTINS)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from llmgw.fleet.types import Fleet
from llmgw.metrics.collectors import FleetCollector, LeaseCollector, RolloutCollector
from llmgw.metrics.instruments import RouterMetrics

ROOT = Path(__file__).resolve().parents[2]
DIRECTORY = ROOT / "deploy" / "grafana"
SNAPSHOT = ROOT / "cluster.example" / "fleet-snapshot.json"
BUILTINS = ("__rate_interval", "__interval", "__range")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_NAME = re.compile(r"\bllmgw_[a-z0-9_]+")
# What Grafana's Prometheus datasource escapes in a regex-formatted variable value.
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|\[\]{}])")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<metric>[^,]+),\s*)?(?P<label>\w+)\)$")


@dataclass(frozen=True)
class Query:
    file: str
    panel: str
    ref: str
    expr: str

    def where(self) -> str:
        return f"{self.file}: panel {self.panel!r}, target {self.ref}"


@dataclass(frozen=True)
class Variable:
    """A query variable, ``label_values(metric, label)``."""

    name: str
    metric: str | None
    label: str


def files() -> list[Path]:
    return sorted(DIRECTORY.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, the panels a (collapsed) row holds included; rows themselves too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panels(panel)


def queries(paths: Sequence[Path] | None = None) -> list[Query]:
    found = []
    for path in files() if paths is None else paths:
        for panel in panels(load(path)):
            for target in panel.get("targets", []):
                found.append(Query(path.name, str(panel.get("title")), str(target.get("refId")),
                                   str(target.get("expr", ""))))
    return found


def variables(dashboard: Mapping[str, Any]) -> list[Variable]:
    """The dashboard's query variables (the datasource variable is not one)."""
    found = []
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(text.strip())
        if match is None:
            raise ValueError(f"variable {variable['name']}: not label_values(...): {text!r}")
        metric = match["metric"].strip() if match["metric"] else None
        found.append(Variable(variable["name"], metric, match["label"]))
    return found


def referenced(expr: str) -> set[str]:
    """Names of the variables ``expr`` uses (``$x``, ``${x}``, ``${x:fmt}``, ``[[x]]``)."""
    return {next(g for g in match.groups() if g) for match in _VARIABLE.finditer(expr)}


def render(expr: str, values: Mapping[str, Sequence[str]], builtins: Mapping[str, str]) -> str:
    """``expr`` as Grafana sends it: variables replaced by their values (several as
    ``(a|b)``, each regex-escaped as Grafana's Prometheus datasource does)."""
    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name in builtins:
            return builtins[name]
        chosen = [_REGEX_SPECIAL.sub(r"\\\\\1", v) for v in values[name]]
        return chosen[0] if len(chosen) == 1 else "(" + "|".join(chosen) + ")"
    return _VARIABLE.sub(value, expr)


def names(expr: str) -> set[str]:
    """The ``llmgw_*`` series names ``expr`` reads."""
    return set(_NAME.findall(expr))


def exposed_names() -> set[str]:
    """Every series name llmgw's metrics listener can expose: the router's instruments
    and every collector ``llmgw serve`` registers, over a real fleet snapshot."""
    registry = CollectorRegistry()
    RouterMetrics(registry)
    fleet = FleetCollector()
    fleet.observe(Fleet.model_validate_json(SNAPSHOT.read_text()))
    registry.register(fleet)
    registry.register(RolloutCollector(lambda: (["m"], {("m", "rolled_back"): 1})))
    registry.register(LeaseCollector(lambda: ("host:1", 1, True)))
    found: set[str] = set()
    for line in generate_latest(registry).decode().splitlines():
        match = re.match(r"# TYPE (\S+) (\S+)", line)
        if match:
            name, kind = match.groups()
            found.add(name)
            if kind == "histogram":
                found.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
    return found
