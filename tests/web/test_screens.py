"""Every page at a phone's width and a desktop's, in light and in dark, in a real browser.

One ``llmgw serve`` for the module, on a fleet of three simulated nodes with long
names (real sshd + agent each, stand-in engines) and usage rows from real traffic on
two keys, so the tables and charts hold what a week of use puts there. Each page
is loaded at 390 px and 1280 px, with the browser's colour scheme emulated light and
dark, and must not scroll sideways: the document's scroll width stays within the
viewport, and a failure names the page and the element that sticks out. Charts must
draw inside their box at either width, in the scheme's colours. The theme switch
overrides the system's scheme and is remembered across a reload.

``/admin/*`` pages are found by following the links /admin has, so a page added
there later is checked too. With ``LLMGW_SCREENSHOTS=1`` (``make screenshots``) the
pages of docs/web.md are saved as ``docs/images/<page>-<width>-<scheme>.png``.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import nodes
from support.engines import MODELS, STUBS, kill_all, recording
from support.pages import CHROMIUM, CHROMIUM_ARGS, IMAGES, Server, login

from llmgw.spec.models import StoreSettings
from llmgw.store import stores, usages
from llmgw.store.usages import UsageRow

pytestmark = pytest.mark.browser

BIG = "meta-llama-3.1-70b-instruct-awq-int4-128k-context"  # on two H100s
SMALL = "qwen2.5-coder-1.5b-instruct-q4-k-m-gguf"  # on CPU
PROJECTS = {"research": {"budget_usd": 20},
            "platform-reliability-engineering-oncall": {"budget_usd": 5}}
KEYS = {"research": ("nightly-evaluation-harness-regressions", 4),
        "platform-reliability-engineering-oncall": ("incident-summariser-bot", 3)}
PRICES = {BIG: (3.0, 6.0), SMALL: (0.5, 1.0)}  # USD per million tokens in, out
WIDTHS = (390, 1280)
SCHEMES = ("light", "dark")
# body's background in each scheme (app.css: --bg), and the first chart series (--s0).
BACKGROUND = {"light": "rgb(246, 247, 249)", "dark": "rgb(15, 20, 25)"}
SERIES0 = {"light": "rgb(11, 92, 173)", "dark": "rgb(94, 168, 242)"}
# The pages docs/web.md shows, by the name their images get.
MAX_ADMIN_PAGES = 12  # /admin/* pages followed from /admin, per width and scheme
SCREENSHOTS = {"/admin": "admin", "/admin/nodes": "admin-nodes",
               "/admin/nodes/gpu-worker-h100-ib-rack-a01": "admin-node", "/chat": "chat",
               "/account": "account"}

# The document's width against the viewport's; when it is wider, the element reaching
# furthest right that no scrolling box of its own contains (a table in .table-wrap may
# be wider than the screen: it scrolls inside its wrapper).
OVERFLOW = """() => {
  const view = window.innerWidth, scroll = document.documentElement.scrollWidth;
  if (scroll <= view) return {view, scroll, widest: null};
  function clipped(el) {
    for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
      if (getComputedStyle(up).overflowX !== "visible") return true;
    }
    return false;
  }
  let widest = null, right = 0;
  for (const el of document.body.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (box.right > right && !clipped(el)) { right = box.right; widest = el; }
  }
  const name = widest.tagName.toLowerCase() + (widest.id ? "#" + widest.id : "") +
    [...widest.classList].map(c => "." + c).join("");
  const text = (widest.textContent || "").trim().slice(0, 60);
  return {view, scroll, widest: `${name} (right edge ${Math.round(right)} px) "${text}"`};
}"""

# Every chart: its box within the viewport, each drawn line with a size inside it, and
# how many of its legend's entries overlap another.
CHARTS = """() => [...document.querySelectorAll("svg.chart")].map(svg => {
  const box = svg.getBoundingClientRect();
  const lines = [...svg.querySelectorAll("polyline.line")].map(line => {
    const r = line.getBoundingClientRect();
    return {w: r.width, h: r.height, inside: r.left >= box.left - 1 && r.right <= box.right + 1};
  });
  const keys = [...svg.querySelectorAll("text.legend")].map(t => t.getBoundingClientRect());
  const overlaps = keys.filter((a, i) => keys.some((b, j) => j > i && a.left < b.right &&
    b.left < a.right && a.top < b.bottom && b.top < a.bottom)).length;
  return {title: svg.getAttribute("aria-label"), left: box.left, right: box.right,
          width: box.width, height: box.height, lines, overlaps,
          stroke: lines.length ? getComputedStyle(svg.querySelector("polyline.s0")).stroke : null};
})"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``llmgw serve`` on three simulated nodes with long names, after some traffic."""
    if not CHROMIUM.exists():
        pytest.skip("chromium is not installed (make sysdeps installs Debian's)")
    tmp = tmp_path_factory.mktemp("screens")
    records = tmp / "records"
    records.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{STUBS}{os.pathsep}{os.environ['PATH']}")
        patch.setenv("TESTENGINE_RECORD_DIR", str(records))
        nodes.sweep_abandoned()
        sim = nodes.SimCluster.create()
        try:
            for index, kind in enumerate(("h100-ib", "l40s-nofabric", "cpu-only")):
                sim.add_node(f"gpu-worker-{kind}-rack-a{index + 1:02d}", kind)
            sim.start(sshd=True, agents=True)
            sim.pin_host_keys()
            yield from _serve(sim, tmp)
        finally:
            sim.close()
            kill_all(records)


def _serve(sim: nodes.SimCluster, tmp: Path) -> Iterator[Server]:
    server = Server(sim.cluster_dir, tmp / "state", tmp / "serve.log")
    stock = recording(MODELS)
    models = {BIG: stock["chat"], SMALL: stock["tiny"]}
    for name, (prompt, completion) in PRICES.items():
        models[name]["pricing"] = {"input_per_mtok": prompt, "output_per_mtok": completion}
    directory = sim.write_cluster({"models": models, "projects": PROJECTS})
    text = (directory / "cluster.yaml").read_text()
    extra = ("  sync: auto\n  drift_interval: 2s\n"
             f"  store: {{path: {tmp / 'state' / 'llmgw.db'}}}\n  listeners:\n"
             + "".join(f"    {k}: {v}\n" for k, v in server.listeners().items()))
    (directory / "cluster.yaml").write_text(text.replace("cluster:\n", "cluster:\n" + extra, 1))
    server.user("ada", "--admin")
    server.user("bob", "--project", "research")
    server.start()
    try:
        server.wait(lambda s: {r["model"] for r in s["replicas"] if r["state"] == "ready"}
                    == {BIG, SMALL}, "both models ready")
        for project, (name, count) in KEYS.items():
            made = server.llmgw("keys", "create", "--project", project, "--name", name)
            assert made.returncode == 0, made.stderr
            for index in range(count):
                reply = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
                    "model": (BIG, SMALL)[index % 2], "prompt": "hi " * (index + 1),
                    "max_tokens": 8}, headers={"Authorization": f"Bearer {made.stdout.strip()}"})
                assert reply.status_code == 200, reply.text
        asyncio.run(_a_week_of_use(tmp / "state" / "llmgw.db"))
        yield server
    finally:
        server.stop()


async def _a_week_of_use(path: Path) -> None:
    """Usage rows for the past week on the keys the traffic used, busier by day than by
    night, as a real week leaves them (the charts' lines then have a shape to draw)."""
    store = await stores.open_store(StoreSettings(path=str(path)))
    try:
        used = {(row.project, row.key_id) for row in await usages.recent(store)}
        now, rows = time.time(), []
        for hour in range(1, 7 * 24):
            ts = now - 3600.0 * hour
            busy = 1 + math.sin(2 * math.pi * ((ts / 3600.0) % 24 - 8) / 24)  # 0 … 2
            for index, (project, key_id) in enumerate(sorted(used, key=str)):
                for n in range(round(busy * (3 - index))):
                    model = (BIG, SMALL)[(hour + n) % 2]
                    tokens = 1200 + 337 * ((hour * 7 + n) % 11)
                    prompt, completion = PRICES[model]
                    rows.append(UsageRow(
                        ts=ts - 60 * n, project=project, key_id=key_id, model=model,
                        endpoint="/v1/chat/completions", status=200, prompt_tokens=tokens,
                        completion_tokens=tokens // 4, latency_ms=850.0 + 10 * n,
                        cost_usd=(prompt * tokens + completion * (tokens // 4)) / 1e6))
        await usages.insert(store, rows)
    finally:
        await store.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                              args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


def _context(chromium: Any, width: int, scheme: str) -> Any:
    return chromium.new_context(viewport={"width": width, "height": 900},
                                color_scheme=scheme)


def _pages(page: Any, base: str) -> list[str]:
    """The pages an admin reaches: the fixed ones, and the /admin/* pages that /admin
    links to and those they link to in turn (at most :data:`MAX_ADMIN_PAGES`)."""
    found: list[str] = []
    queue = ["/admin"]
    while queue and len(found) < MAX_ADMIN_PAGES:
        answer = _open(page, base + queue.pop(0))
        if answer is None:
            continue
        for href in page.eval_on_selector_all(
                "a[href^='/admin/']", "links => links.map(a => a.getAttribute('href'))"):
            path = href.split("#")[0]
            if path.split("?")[0] != "/admin/live" and path not in found + queue:
                queue.append(path)
                found.append(path)
    return ["/admin", "/admin?range=7d", *sorted(found), "/chat", "/account",
            "/admin?range=forever"]  # the last: an error page (400)


def _open(page: Any, url: str) -> Any:
    """Go to ``url``; its response when it is a page (HTML), else None: a link may be
    a log that never ends or a download, which the browser never finishes loading."""
    answer = page.goto(url, wait_until="commit")
    assert answer is not None, url
    if not answer.headers.get("content-type", "").startswith("text/html"):
        return None
    page.wait_for_load_state("load")
    return answer


def _check(page: Any, path: str, width: int, scheme: str, problems: list[str]) -> None:
    where = f"{path} at {width} px, {scheme}"
    seen = page.evaluate(OVERFLOW)
    if seen["widest"] is not None:
        problems.append(f"{where}: the document is {seen['scroll']} px wide in a "
                        f"{seen['view']} px viewport; widest: {seen['widest']}")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    if background != BACKGROUND[scheme]:
        problems.append(f"{where}: body background {background}, not {scheme}'s")
    for chart in page.evaluate(CHARTS):
        name = f"{where}: chart {chart['title']!r}"
        if chart["width"] < 200 or chart["height"] < 80 or chart["right"] > width:
            problems.append(f"{name} is drawn {chart['width']:.0f}x{chart['height']:.0f} "
                            f"px, right edge {chart['right']:.0f}")
        if not chart["lines"] or not all(ln["w"] > 10 and ln["inside"] for ln in chart["lines"]):
            problems.append(f"{name} draws no line inside its box: {chart['lines']}")
        elif chart["stroke"] != SERIES0[scheme]:
            problems.append(f"{name}: first series {chart['stroke']}, not {scheme}'s")
        if chart["overlaps"]:
            problems.append(f"{name}: {chart['overlaps']} legend entries overlap another")


def _shoot(page: Any, path: str, width: int, scheme: str) -> None:
    name = SCREENSHOTS.get(path)
    if IMAGES is None or name is None:
        return
    IMAGES.mkdir(parents=True, exist_ok=True)
    target = str(IMAGES / f"{name}-{width}-{scheme}.png")
    if name == "admin-node":  # its GPUs: the rest names the fixture's paths on this machine
        page.locator('section[aria-labelledby="gpus-title"]').screenshot(path=target)
        return
    page.screenshot(path=target, full_page=True)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_width_in_the_scheme(
    fleet: Server, chromium: Any, width: int, scheme: str
) -> None:
    context = _context(chromium, width, scheme)
    try:
        page = context.new_page()
        page.goto(f"{fleet.url}/login")
        problems: list[str] = []
        _check(page, "/login", width, scheme, problems)
        login(page, fleet.url, "ada")
        paths = _pages(page, fleet.url)
        for path in paths:
            answer = _open(page, f"{fleet.url}{path}")
            if answer is None and path.startswith("/admin/"):
                continue  # not a page: checked by the tests of what it is
            assert answer is not None, path
            assert answer.status == (400 if "forever" in path else 200), path
            if path == "/chat":  # an answer in the log, as the page looks in use
                page.select_option("#model", SMALL)
                page.select_option("#project", "research")
                page.fill("#message", "Summarise last night's incident for the on-call "
                          "channel: " + "gpu-worker-h100-ib-rack-a01 " * 3)
                page.click("#send")
                page.wait_for_function(
                    "() => { const t = document.querySelector('.msg.assistant .text');"
                    " return t && t.textContent.startsWith('echo'); }", timeout=30_000)
                page.wait_for_selector("#send:not([disabled])", timeout=30_000)
            _check(page, path, width, scheme, problems)
            _shoot(page, path, width, scheme)
        charted = [p for p in paths if p in ("/admin", "/account")]
        assert charted == ["/admin", "/account"], paths
        assert not problems, "\n".join(problems)
    finally:
        context.close()


def test_a_user_s_pages_and_refusals_fit_a_phone(fleet: Server, chromium: Any) -> None:
    context = _context(chromium, 390, "dark")
    try:
        page = context.new_page()
        login(page, fleet.url, "bob")
        problems: list[str] = []
        for path, status in (("/chat", 200), ("/account", 200), ("/admin", 403)):
            answer = page.goto(f"{fleet.url}{path}")
            assert answer is not None and answer.status == status, path
            _check(page, path, 390, "dark", problems)
        assert not problems, "\n".join(problems)
    finally:
        context.close()


@pytest.mark.parametrize(("system", "chosen"), [("light", "dark"), ("dark", "light")])
def test_the_theme_switch_overrides_the_system_and_is_remembered(
    fleet: Server, chromium: Any, system: str, chosen: str
) -> None:
    context = _context(chromium, 1280, system)
    try:
        page = context.new_page()
        login(page, fleet.url, "ada")
        page.goto(f"{fleet.url}/account")

        def background() -> str:
            return str(page.evaluate("getComputedStyle(document.body).backgroundColor"))

        def stroke() -> str:
            return str(page.evaluate(
                "getComputedStyle(document.querySelector('svg.chart polyline.s0')).stroke"))

        assert page.input_value("#theme-switch") == "system"
        assert background() == BACKGROUND[system]
        page.select_option("#theme-switch", chosen)
        assert background() == BACKGROUND[chosen] and stroke() == SERIES0[chosen]
        page.reload()
        assert page.input_value("#theme-switch") == chosen
        assert background() == BACKGROUND[chosen] and stroke() == SERIES0[chosen]
        page.goto(f"{fleet.url}/admin")  # another page
        assert background() == BACKGROUND[chosen]
        page.select_option("#theme-switch", "system")
        page.reload()
        assert page.input_value("#theme-switch") == "system"
        assert background() == BACKGROUND[system]
    finally:
        context.close()
