"""The admin API's usage export and audit log, on both stores, over real HTTP; and every
admin API call that changes something lands in the audit log with who and from where."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmgw.daemon import admin
from llmgw.daemon.reconcilers import Daemon
from llmgw.spec.models import Cluster, StoreSettings
from llmgw.store import stores
from llmgw.store.stores import Store
from llmgw.store.usages import UsageRow

TOKEN = "admin-token-for-the-test"
pytestmark = pytest.mark.filterwarnings("ignore:Bare functions are deprecated:DeprecationWarning")
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def served(tmp_path: Path, store_settings: dict[str, str],
                 ) -> AsyncIterator[tuple[str, Store]]:
    store = await stores.open_store(StoreSettings.model_validate(store_settings))
    base = dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC).timestamp()
    await store.insert_usage([
        UsageRow(base, "research", "aaaaaaaaaaaa", "chat", "/v1/chat/completions", 200, 10,
                 5, 3.0, 0.5),
        UsageRow(base + 60, "research", "aaaaaaaaaaaa", "chat", "/v1/chat/completions", 502,
                 None, None, 3.0, 0.0),
        UsageRow(base + 120, "ops", "bbbbbbbbbbbb", "chat", "/v1/chat/completions", 200, 1,
                 1, 3.0, 0.25)])
    daemon = Daemon(tmp_path, Cluster.model_validate({"cluster": {"name": "c"}}), store=store)
    app = admin.create_app(daemon, TOKEN)

    async def change(_: web.Request) -> web.Response:  # a call that changes something
        return web.json_response({"changed": True})
    app.router.add_post("/api/v1/things/{name}", change)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", store
    finally:
        await runner.cleanup()
        await store.close()


async def fetch(url: str, method: str = "GET",
                headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.request(
            method, url, headers=AUTH if headers is None else headers) as response:
        return response.status, await response.text()


async def test_usage_export_as_json_and_csv(served: tuple[str, Store]) -> None:
    base, _ = served
    async with aiohttp.ClientSession() as session, session.get(
            f"{base}/api/v1/usage?from=2026-12-01&to=2026-12-02&group_by=project,model",
            headers=AUTH) as response:
        assert response.status == 200
        doc = await response.json()
    assert doc["rows"] == [
        {"project": "ops", "model": "chat", "requests": 1, "prompt_tokens": 1,
         "completion_tokens": 1, "cost_usd": 0.25, "errors": 0},
        {"project": "research", "model": "chat", "requests": 2, "prompt_tokens": 10,
         "completion_tokens": 5, "cost_usd": 0.5, "errors": 1}]
    status, text = await fetch(f"{base}/api/v1/usage?from=2026-12-01&to=2026-12-02"
                               "&group_by=day&format=csv&tz=America/New_York")
    assert status == 200
    assert list(csv.reader(io.StringIO(text)))[1:] == [
        ["2026-12-01", "3", "11", "6", "0.750000", "1"]]


@pytest.mark.parametrize(("query", "message"), [
    ("from=2026-12-01", "from and to are both needed"),
    ("from=2026-12-01&to=2026-12-02&group_by=user", "group_by: 'user' is not one of"),
    ("from=2026-12-01&to=2026-12-02&format=xml", "format 'xml' is not one of csv, json"),
])
async def test_bad_usage_queries_are_refused(served: tuple[str, Store], query: str,
                                             message: str) -> None:
    status, text = await fetch(f"{served[0]}/api/v1/usage?{query}")
    assert status == 400 and message in text


async def test_the_export_and_the_audit_log_need_the_admin_token(
    served: tuple[str, Store],
) -> None:
    for path in ("/api/v1/usage?from=2026-12-01&to=2026-12-02", "/api/v1/audit"):
        assert (await fetch(served[0] + path, headers={}))[0] == 401
        assert (await fetch(served[0] + path, headers={"Authorization": "Bearer x"}))[0] == 401


async def test_an_admin_call_that_changes_something_is_audited(
    served: tuple[str, Store],
) -> None:
    base, store = served
    assert (await fetch(f"{base}/api/v1/things/<script>", "POST"))[0] == 200
    assert (await fetch(f"{base}/api/v1/usage?from=2026-12-01&to=2026-12-02"))[0] == 200
    [entry] = await store.audit_entries()  # the read is not audited
    assert (entry.actor, entry.source, entry.line()) == (
        "admin-token", "127.0.0.1", "admin.post route=/api/v1/things/{name}")
    status, text = await fetch(f"{base}/api/v1/audit?since=1h&limit=5")
    assert status == 200 and '"action": "admin.post"' in text
    assert (await fetch(f"{base}/api/v1/audit?since=yesterday"))[0] == 400
    assert (await fetch(f"{base}/api/v1/audit?limit=0"))[0] == 400
