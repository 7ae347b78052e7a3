"""Every metric the router exports has a row in the metrics tables of the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmgw.metrics.instruments import RouterMetrics

DOCS = Path(__file__).parents[2] / "docs"


def router_metric_names() -> set[str]:
    registry = CollectorRegistry()
    RouterMetrics(registry)
    scrape = generate_latest(registry).decode()
    return set(re.findall(r"^# TYPE (\S+) ", scrape, re.MULTILINE))


def table_names(page: str) -> set[str]:
    """Names in the first column of the page's metric tables (`| `name` | labels | ...`)."""
    names: set[str] = set()
    for line in (DOCS / page).read_text().splitlines():
        if line.startswith("| `llmgw_"):
            names.update(re.findall(r"`(llmgw_[a-z0-9_]+)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("page", ["operations.md", "router.md"])
def test_every_router_metric_is_in_the_table(page: str) -> None:
    missing = router_metric_names() - table_names(page)
    assert not missing, f"{page}'s metrics table lacks {sorted(missing)}"
