"""/admin in a real browser, showing a real fleet of simulated nodes.

Three simulated nodes (real sshd + agent each: 8× H100 on InfiniBand, 4× L40S,
CPU only) run stand-in engines placed by a real ``llmgw serve``. The page's
figures must be those of the one summary function: they are compared with
``llmgw status`` (which asks the agents itself) and with the admin API.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import nodes
from support.engines import MODELS, STUBS, kill_all, recording
from support.pages import Server, login, shot
from support.plugin import SimClusterFactory


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("PATH", f"{STUBS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TESTENGINE_RECORD_DIR", str(records))
    yield records
    kill_all(records)


@pytest.fixture
def fleet_server(sim_cluster: SimClusterFactory, engines: Path,
                 tmp_path: Path) -> Iterator[Server]:
    sim: nodes.SimCluster = sim_cluster(3)
    server = Server(sim.cluster_dir, tmp_path / "state", tmp_path / "serve.log")
    models = recording(MODELS)
    # min 1 keeps it running; past 1 s without a request it counts as idle on /admin.
    models["chat"]["scaling"] = {"min": 1, "max": 1, "idle_timeout": "1s"}
    models["tiny"]["pricing"] = {"input_per_mtok": 3000.0, "output_per_mtok": 6000.0}
    directory = sim.write_cluster({"models": models, "projects": {
        "research": {"budget_usd": 20}, "ops": {}}})
    text = (directory / "cluster.yaml").read_text()
    extra = ("  sync: auto\n  drift_interval: 2s\n"
             f"  store: {{path: {tmp_path / 'state' / 'llmgw.db'}}}\n  listeners:\n"
             + "".join(f"    {k}: {v}\n" for k, v in server.listeners().items()))
    (directory / "cluster.yaml").write_text(text.replace("cluster:\n", "cluster:\n" + extra, 1))
    server.user("ada", "--admin")
    server.user("bob", "--project", "research")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def both_ready(status: dict[str, Any]) -> bool:
    up = {r["model"] for r in status["replicas"] if r["state"] == "ready"}
    return up == {"chat", "tiny"} and not (status["plan"] or {}).get("has_changes", True)


def test_admin_shows_the_simulated_fleet_with_the_status_summary(
    fleet_server: Server, browser: Any
) -> None:
    server = fleet_server
    # chat counts as idle 1 s after it is ready: the status may come sooner than that.
    status = server.wait(
        lambda s: both_ready(s) and [i["model"] for i in s["summary"]["idle"]] == ["chat"],
        "both models ready and chat idle past its 1 s")
    summary = status["summary"]
    assert summary["capacity"]["h100-80g"]["used"] == 2  # chat: tensor_parallel 2

    # `llmgw status` computes its GPU line with the same function.
    printed = server.llmgw("status").stdout
    gpu_line = next(line for line in printed.splitlines() if line.startswith("GPUs: "))

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    login(page, server.url, "ada")
    assert page.url.endswith("/admin")
    live = str(page.text_content("#live"))
    for name, counts in summary["capacity"].items():
        row = str(page.text_content(f".capacity:has-text('{name}')"))
        expected = (f"{counts['used']} used · {counts['free']} free · {counts['faulty']} faulty"
                    f" · {counts['total']} total")
        assert expected in row, row
        assert f"{name} {counts['used']} used, {counts['free']} free" in gpu_line
    assert page.locator("svg.bar").count() == len(summary["capacity"])
    for fabric, free in summary["free_nodes"].items():
        assert str(len(free)) in str(page.text_content(f"tr:has-text('{fabric}')"))
    for replica in status["replicas"]:
        row = page.locator(f"tr:has-text('{replica['model']}'):has-text('{replica['node']}')")
        assert row.count() >= 1 and "ready" in str(row.first.text_content())
    assert [i["model"] for i in summary["idle"]] == ["chat"]  # 2 GPUs, never used
    # Some traffic on two keys, for the usage charts.
    for project, count in (("research", 3), ("ops", 2)):
        made = server.llmgw("keys", "create", "--project", project, "--name", f"{project}-ci")
        for _ in range(count):
            reply = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
                "model": "tiny", "prompt": "hi", "max_tokens": 8},
                headers={"Authorization": f"Bearer {made.stdout.strip()}"})
            assert reply.status_code == 200, reply.text
    idle = str(page.text_content("#idle-title + *"))
    assert "chat r" in idle and "holds 2 GPUs" in idle and "tiny" not in idle
    assert "Plan: 0 to create, 0 to replace, 0 to destroy" in live

    # A refused edit shows with its error; the page refreshes on its own to show it.
    (server.directory / "broken.yaml").write_text("models:\n  chat:\n    profiles: oops\n")
    server.wait(lambda s: bool(s["refused_edit"]), "the refused edit")
    page.wait_for_selector("#live h3:has-text('Refused edit')", timeout=60_000)
    assert "broken.yaml:3:15: models.chat.profiles" in str(page.text_content("#live"))
    assert str(server.directory) not in str(page.text_content("#live"))
    assert "no requests in this period" not in str(page.text_content("#use-title + p + div"))
    assert page.get_attribute("#live", "data-refreshed")
    shot(page, "admin.png")
    (server.directory / "broken.yaml").unlink()

    # The admin API takes the admin's session cookie, and nothing from anyone else.
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    with httpx.Client(cookies=cookies) as admin:
        assert admin.get(f"{server.admin}/api/v1/status").status_code == 200
    assert httpx.get(f"{server.admin}/api/v1/status").status_code == 401
    assert httpx.get(f"{server.admin}/api/v1/fleet",
                     headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{server.admin}/health").status_code == 200
    assert httpx.get(f"{server.url}/health").status_code == 200
    page.close()

    # A user who is not an admin is turned away from /admin and from the admin API.
    other = browser.new_page()
    login(other, server.url, "bob")
    answer = other.goto(f"{server.url}/admin")
    assert answer is not None and answer.status == 403
    cookies = {c["name"]: c["value"] for c in other.context.cookies()}
    with httpx.Client(cookies=cookies) as client:
        assert client.get(f"{server.admin}/api/v1/status").status_code == 401
    assert re.search(r"default-src 'none'", answer.headers["content-security-policy"])
    other.close()
