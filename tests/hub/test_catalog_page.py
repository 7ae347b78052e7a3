"""/admin/catalog over real HTTP: a router with the pages (support.stacks) whose cluster's
weights endpoint is a real `llmgw mirror` server; hostile repo text escaped, and "add this
model" answering with a diff to commit, never a row in the store."""

from __future__ import annotations

import re
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mirror_support import GEMMA, GEMMA_REPO, gemma_repo, serving
from support.stacks import Stack

from llmgw.hub import caches
from llmgw.router import Settings
from llmgw.spec import loading
from llmgw.spec.models import Cluster
from llmgw.store import users

HOSTILE = "<img src=x onerror=alert(1)>"
needs_gemma = pytest.mark.skipif(not GEMMA.exists(), reason="the test model is not built yet")


def login(client: httpx.Client) -> None:
    form = client.get("/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token
    answer = client.post("/login", data={"name": "ada", "password": "ada-admin-pass",
                                         "csrf": token.group(1)})
    assert answer.status_code == 303


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Stack, httpx.Client]]:
    root = tmp_path / "mirror" / "hub"
    gemma_repo(root)
    config = tmp_path / "hostile" / "config.json"
    config.parent.mkdir()
    config.write_text('{"architectures": ["' + HOSTILE.replace('"', "'") + '"], '
                      '"num_hidden_layers": 2}')
    caches.add(root, "evil/hostile-repo", {"config.json": config})
    with serving(root) as mirror:
        spec = Cluster.model_validate({
            "cluster": {"name": "lab", "weights": {"endpoint": mirror.url}},
            "nodes": {"gpu-01": {"address": "10.0.0.1",
                                 "gpus": [{"class": "l4-22g", "count": 2}]}},
        })
        stack = Stack(tmp_path, spec, Settings(), 0, pages=True)
        stack.run(users.create(stack.db, "ada", "ada-admin-pass", admin=True))
        try:
            with httpx.Client(base_url=stack.url, timeout=30) as client:
                login(client)
                yield stack, client
        finally:
            stack.close()


@needs_gemma
def test_the_catalog_lists_shows_and_adds_as_a_diff(
        site: tuple[Stack, httpx.Client], tmp_path: Path) -> None:
    stack, client = site
    listing = client.get("/admin/catalog")
    assert listing.status_code == 200
    assert f'href="/admin/catalog/{GEMMA_REPO}"' in listing.text
    assert "<img" not in listing.text
    assert client.get("/admin/catalog", params={"q": "gemma"}).text.count("data-repo=") == 1
    page = client.get(f"/admin/catalog/{GEMMA_REPO}")
    assert page.status_code == 200
    assert "gemma3" in page.text and "Q4_K_M" in page.text
    assert "fits on 1× l4-22g at 8k and 32k context" in page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf
    before = _rows(stack.db_path)
    added = client.post(f"/admin/catalog/{GEMMA_REPO}", data={
        "csrf": csrf.group(1), "model": "gemma", "gpu_class": "l4-22g", "engine": "llama.cpp"})
    assert added.status_code == 200
    assert _rows(stack.db_path) == before  # a diff to commit, never a row
    diff = re.search(r'<pre id="diff"><code>(.*?)</code></pre>', added.text, re.S)
    assert diff and "fits on 1× l4-22g" in added.text
    # The diff applies to a cluster directory and the result validates.
    directory = tmp_path / "cluster"
    directory.mkdir()
    (directory / "cluster.yaml").write_text("cluster: {name: lab}\n")
    patch = (diff.group(1).replace("&#34;", '"').replace("&quot;", '"')
             .replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&"))
    subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=directory, check=True)
    cluster = loading.load(directory)
    assert cluster.models["gemma"].source == GEMMA_REPO
    assert cluster.models["gemma"].shape is not None


def test_hostile_text_and_forms_are_refused_or_escaped(
        site: tuple[Stack, httpx.Client]) -> None:
    _, client = site
    page = client.get("/admin/catalog/evil/hostile-repo")
    assert page.status_code == 200
    assert "<img" not in page.text and "&lt;img src=x onerror=alert(1)&gt;" in page.text
    for bad in ("/admin/catalog/evil/a--b", "/admin/catalog/evil/-x", "/admin/catalog/e/%2e%2e"):
        assert client.get(bad).status_code == 404, bad
    assert client.get("/admin/catalog/no/such-repo").status_code == 404
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf
    for form in ({"model": "Bad Name!", "gpu_class": "l4-22g", "engine": "vllm"},
                 {"model": "ok", "gpu_class": "h100-80g", "engine": "vllm"},
                 {"model": "ok", "gpu_class": "l4-22g", "engine": "ollama"}):
        answer = client.post("/admin/catalog/evil/hostile-repo", data={"csrf": csrf.group(1),
                                                                       **form})
        assert answer.status_code == 400
    assert client.post("/admin/catalog/evil/hostile-repo", data={
        "model": "ok", "gpu_class": "l4-22g", "engine": "vllm"}).status_code == 403


def _rows(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as connection:
        tables = [r[0] for r in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: connection.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
                for t in tables if t not in ("sessions", "audit_log")}
