"""The Grafana dashboards in deploy/grafana, without a Prometheus: well formed, on real names.

Each ``deploy/grafana/*.json`` must be a dashboard Grafana imports as it is:
a ``${datasource}`` Prometheus variable that every panel and target uses,
unique panel ids, every variable an expression names defined. Every
``llmgw_*`` name an expression or a variable reads must be one llmgw exposes
(``support.dashboards.exposed_names``: from the real instruments and
collectors), so renaming a metric breaks this test. ``promtool check rules``
parses every expression, as rendered for Prometheus, as a recording rule.
The real evaluation against a Prometheus scraping llmgw is
``tests/e2e/test_dashboards.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from support import dashboards

FILES = dashboards.files()
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "6h"}


def ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_the_fleet_and_router_dashboards_ship() -> None:
    assert {"fleet.json", "router.json"} <= set(ids(FILES))


@pytest.mark.parametrize("path", FILES, ids=ids(FILES))
def test_the_dashboard_is_importable_and_uses_the_datasource_variable(path: Path) -> None:
    board = dashboards.load(path)
    assert board["uid"].startswith("llmgw-") and board["title"].startswith("llmgw ")
    assert isinstance(board["schemaVersion"], int) and board["id"] is None
    templating = board["templating"]["list"]
    source = [v for v in templating if v["type"] == "datasource"]
    assert [(v["name"], v["query"]) for v in source] == [("datasource", "prometheus")]
    panels = list(dashboards.panels(board))
    panel_ids = [p["id"] for p in panels]
    assert len(panel_ids) == len(set(panel_ids)), f"duplicate panel ids in {path.name}"
    defined = {v["name"] for v in templating}
    for panel in panels:
        if panel["type"] == "row":
            continue
        where = f"{path.name}: panel {panel['title']!r}"
        assert panel["datasource"] == DATASOURCE, where
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), where
        assert panel["targets"], f"{where} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), where
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, where
            assert target["expr"].strip(), f"{where}: target {target['refId']} is empty"
            used = dashboards.referenced(target["expr"]) - set(dashboards.BUILTINS)
            assert used <= defined, f"{where}: undefined variables {sorted(used - defined)}"
    for variable in templating:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def exprs_and_variables() -> list[tuple[str, str]]:
    found = [(q.where(), q.expr) for q in dashboards.queries()]
    for path in FILES:
        for variable in dashboards.variables(dashboards.load(path)):
            found.append((f"{path.name}: variable {variable.name}", variable.metric or ""))
    return found


@pytest.mark.parametrize(("where", "expr"), exprs_and_variables(),
                         ids=[w for w, _ in exprs_and_variables()])
def test_every_name_a_query_reads_is_exposed_by_llmgw(where: str, expr: str) -> None:
    used = dashboards.names(expr)
    assert used, f"{where} reads no llmgw series: {expr}"
    missing = used - dashboards.exposed_names()
    assert not missing, f"{where} reads series llmgw does not expose: {sorted(missing)}\n{expr}"


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool is not installed (make sysdeps)")
def test_promtool_parses_every_query(tmp_path: Path) -> None:
    found = dashboards.queries()
    values: dict[str, list[str]] = {}
    for path in FILES:
        for variable in dashboards.variables(dashboards.load(path)):
            values[variable.name] = ["a-value", "another.value"]
    rules: list[dict[str, Any]] = [
        {"record": f"dashboard:query:{index}", "expr": dashboards.render(q.expr, values, BUILTINS)}
        for index, q in enumerate(found)
    ]
    path = tmp_path / "rules.yml"
    with path.open("w") as out:
        YAML(typ="safe").dump({"groups": [{"name": "dashboards", "rules": rules}]}, out)
    result = subprocess.run(["promtool", "check", "rules", str(path)],
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    for index, query in enumerate(found):
        assert f"dashboard:query:{index}\"" not in output or result.returncode == 0, (
            f"{query.where()}: promtool cannot parse it: {query.expr}\n{output}")
    assert result.returncode == 0, output
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
