"""The stylesheet's two colour schemes and the charts' markup, without a browser.

app.css writes its dark set twice (for the switch's explicit "dark", and for
"system" on a dark system): the two must not drift apart, and each scheme must
define every variable any rule uses. Charts carry a viewBox and no fixed size,
and take their colours from classes only, so they scale and follow the scheme.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from llmgw.planning.summaries import GpuCounts
from llmgw.store.usages import Bucket
from llmgw.web import charts

CSS = resources.files("llmgw.web").joinpath("static", "app.css").read_text()
DECLARATION = re.compile(r"(--[a-z0-9-]+)\s*:\s*([^;]+);")


def _block(selector: str) -> dict[str, str]:
    start = CSS.index(selector + " {")
    body = CSS[start + len(selector) + 2:CSS.index("}", start)]
    return dict(DECLARATION.findall(body))


LIGHT = _block(":root")
SCHEMES = {"light": LIGHT, "dark (switch)": _block(':root[data-theme="dark"]'),
           "dark (system)": _block(':root:not([data-theme="light"])')}


def test_the_two_dark_sets_are_the_same() -> None:
    assert SCHEMES["dark (switch)"] == SCHEMES["dark (system)"]
    assert SCHEMES["dark (switch)"] != LIGHT


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_scheme_defines_every_variable_used(scheme: str) -> None:
    used = set(re.findall(r"var\((--[a-z0-9-]+)\s*[,)]", CSS))
    assert used - set(SCHEMES[scheme]) == set()
    assert set(SCHEMES[scheme]) == set(LIGHT)  # and no more: nothing half-themed


def test_rules_name_no_colour_outside_the_schemes() -> None:
    rules = CSS
    for block in (':root {', ':root[data-theme="dark"] {', ':root:not([data-theme="light"]) {'):
        start = rules.index(block)
        rules = rules[:start] + rules[rules.index("}", start) + 1:]
    # A fallback colour in var(--x, #…) is allowed: the schemes define --x, so it never shows.
    rules = re.sub(r"var\((--[a-z0-9-]+)\s*,[^)]*\)", r"var(\1)", rules)
    assert re.findall(r"#[0-9a-fA-F]{3,6}\b|rgb\(", rules) == []


BUCKETS = [Bucket(start=3600.0 * h, group=f"model-{h % 3}", requests=h, tokens=10 * h,
                  cost_usd=0.01 * h) for h in range(24)]
USAGE = charts.usage_chart(BUCKETS, since=0.0, step=3600.0, slots=24, value="requests",
                           title="Requests per model")
EMPTY = charts.usage_chart([], since=0.0, step=3600.0, slots=24, value="cost_usd", title="Spend")
BAR = charts.capacity_bar("h100-80g", GpuCounts(total=8, used=2, free=5, faulty=1))


@pytest.mark.parametrize("svg", [USAGE, EMPTY, BAR], ids=["usage", "empty", "bar"])
def test_charts_have_a_view_box_and_colour_by_class_only(svg: str) -> None:
    assert re.search(r'viewBox="0 0 \d+ \d+"', svg[:svg.index(">")]), svg[:200]
    assert not re.search(r"\b(fill|stroke|style)=", svg), svg


@pytest.mark.parametrize("svg", [USAGE, EMPTY], ids=["usage", "empty"])
def test_usage_charts_take_the_width_they_get(svg: str) -> None:
    root = svg[:svg.index(">")]
    assert 'width="100%"' in root and "height=" not in root, root


def test_the_scheme_is_set_before_the_first_paint_by_a_file_not_inline() -> None:
    base = resources.files("llmgw.web").joinpath("templates", "base.html").read_text()
    head = base[:base.index("</head>")]
    # In <head>, after the stylesheet, neither deferred nor async: it runs before <body>
    # is drawn, so a remembered "dark" never flashes light. Inline script: the CSP refuses it.
    assert '<script src="/static/theme.js"></script>' in head
    assert head.index("/static/app.css") < head.index("/static/theme.js")
    assert re.findall(r"<script>|<script\s+(?!src=)[^>]*>", base) == []
