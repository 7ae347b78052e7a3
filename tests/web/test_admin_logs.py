"""/admin/logs in a real browser: a replica's log through the daemon's agents, live.

A real ``llmgw serve`` runs a stand-in engine on a simulated node (real sshd
and agent) that prints its secret env at start. The admin follows the
replicas listing's "log" link: the engine's lines are there with the secret
masked, a request made meanwhile appears without a reload (server-sent
events through ``logs.js``; the CSP stays strict), and after a SIGKILL the
"run before the latest" shows how the killed run ended. Anyone else is
turned away; an unknown replica is a located 404.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import nodes
from support.engines import STUBS, kill_all, recording, running
from support.pages import Server, login
from support.plugin import SimClusterFactory

PLANTED = "opensesame-4242"  # no shape the scrubber knows: only the agent's value mask


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("PATH", f"{STUBS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TESTENGINE_RECORD_DIR", str(records))
    yield records
    kill_all(records)


@pytest.fixture
def server(sim_cluster: SimClusterFactory, engines: Path, tmp_path: Path) -> Iterator[Server]:
    sim: nodes.SimCluster = sim_cluster(1, hardware=("cpu-only",))
    secret = tmp_path / "token"
    secret.write_text(PLANTED + "\n")
    served = Server(sim.cluster_dir, tmp_path / "state", tmp_path / "serve.log")
    models = recording({"tiny": {"source": "/models/tiny.gguf", "profiles": [{
        "engine": "llama.cpp", "cpu": True, "min_memory_gb": 1,
        "secret_env": {"LICENSE_ID": str(secret)},
        "unchecked_args": {"say-env": "LICENSE_ID"},  # the test engine's: a leaky engine
    }]}})
    directory = sim.write_cluster({"models": models})
    text = (directory / "cluster.yaml").read_text()
    extra = ("  sync: auto\n  drift_interval: 2s\n"
             f"  store: {{path: {tmp_path / 'state' / 'llmgw.db'}}}\n  listeners:\n"
             + "".join(f"    {k}: {v}\n" for k, v in served.listeners().items()))
    (directory / "cluster.yaml").write_text(text.replace("cluster:\n", "cluster:\n" + extra, 1))
    served.user("ada", "--admin")
    served.user("bob")
    served.start()
    try:
        yield served
    finally:
        served.stop()


def tiny_ready(status: dict[str, Any]) -> bool:
    return any(r["model"] == "tiny" and r["state"] == "ready" for r in status["replicas"])


def test_a_replicas_log_on_admin_follows_live_and_masks_its_secret(
    server: Server, engines: Path, browser: Any
) -> None:
    server.wait(tiny_ready, "tiny ready")
    first = running(engines)["tiny"]["pid"]
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    login(page, server.url, "ada")
    page.click("#live a:has-text('log')")
    page.wait_for_url("**/admin/logs/tiny/0")
    assert page.text_content("h1") == "Log of tiny r0"
    page.wait_for_selector("#log:has-text('env LICENSE_ID=[redacted]')", timeout=30_000)
    assert "tiny r0 s0 on node-01 · supervise log" in str(page.text_content(".summary"))

    # A request now: its line arrives without a reload.
    argv = running(engines)["tiny"]["argv"]
    port = argv[argv.index("--port") + 1]
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=30)
    assert reply.status_code == 200
    page.wait_for_selector("#log:has-text('POST /v1/completions')", timeout=30_000)
    assert PLANTED not in page.content()

    # SIGKILL: the run before the latest shows how it ended, and what it served.
    os.kill(first, signal.SIGKILL)
    server.wait(lambda s: tiny_ready(s) and running(engines).get("tiny", {}).get("pid")
                not in (None, first), "tiny restarted")
    page.click("a:has-text('the run before the latest')")
    page.wait_for_url("**/admin/logs/tiny/0?previous=1")
    killed = str(page.text_content("#log"))
    assert killed.rstrip().endswith("-- llmgw: main process killed by SIGKILL")
    assert f"testengine[{first}]: env LICENSE_ID=[redacted]" in killed
    assert "POST /v1/completions" in killed and PLANTED not in page.content()
    assert errors == []

    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    with httpx.Client(cookies=cookies, base_url=server.url, timeout=30) as admin:
        missing = admin.get("/admin/logs/tiny/9")
        assert missing.status_code == 404 and "tiny r9: no such replica (running: r0)" in \
            missing.text
        assert admin.get("/admin/logs/Bad%2Fname/0").status_code in (400, 404)
        assert admin.get("/admin/logs/tiny/x").status_code == 400
        with admin.stream("GET", "/admin/logs/tiny/0/events") as events:
            assert events.headers["content-type"].startswith("text/event-stream")
            head = next(events.iter_lines())
            assert head == "event: reset"
    page.close()

    other = browser.new_page()
    login(other, server.url, "bob")
    for path in ("/admin/logs/tiny/0", "/admin/logs/tiny/0/events"):
        answer = other.goto(f"{server.url}{path}")
        assert answer is not None and answer.status == 403
    other.close()
    assert httpx.get(f"{server.url}/admin/logs/tiny/0", follow_redirects=False,
                     timeout=30).status_code == 303  # not logged in: to the login page
