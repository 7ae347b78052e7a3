"""The audit log from the pages, and /admin's figures against the usage export.

A router with the pages (:class:`support.stacks.Stack`) on each store (SQLite and a real
PostgreSQL), driven over real HTTP with httpx and the official ``openai`` client.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from support.stacks import Stack, cluster

from llmgw.router import Settings
from llmgw.store import exports, usages, users
from llmgw.store.audits import Entry
from llmgw.web import admins


def login(client: httpx.Client, base: str, name: str, password: str) -> httpx.Response:
    form = client.get(f"{base}/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token
    return client.post(f"{base}/login", data={"name": name, "password": password,
                                              "csrf": token.group(1)})


def csrf_of(client: httpx.Client, base: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)"',
                      client.get(f"{base}/account").text)
    assert found
    return found.group(1)

WRONG = "Hunter2-not-bobs-password"


@pytest.fixture
def stack(tmp_path: Path, store_settings: dict[str, str]) -> Iterator[Stack]:
    made = Stack(tmp_path, cluster(research=None, ops=None), Settings(), 1, store_settings,
                 pages=True)
    made.route({"chat": made.upstreams, "coder": made.upstreams})
    made.run(users.create(made.db, "bob", "bob-user-pass", projects=["research"]))
    made.run(users.create(made.db, "ada", "ada-admin-pass", admin=True))
    try:
        yield made
    finally:
        made.close()


def entries(stack: Stack) -> list[Entry]:
    return list(reversed(stack.run(stack.db.audit_entries())))


def test_logins_are_audited_without_the_password_or_the_attempted_text(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        assert login(client, stack.url, "bob", WRONG).status_code == 401
        assert login(client, stack.url, "<img src=x>", WRONG + "2").status_code == 401
        assert login(client, stack.url, "bob", "bob-user-pass").status_code == 303
        assert client.post(f"{stack.url}/logout",
                           data={"csrf": csrf_of(client, stack.url)}).status_code == 303
    assert [(e.actor, e.source, e.line()) for e in entries(stack)] == [
        ("-", "127.0.0.1", "login.failed user=bob method=password reason=password"),
        ("-", "127.0.0.1", "login.failed user=? method=password reason=password"),
        ("bob", "127.0.0.1", "login.ok user=bob method=password"),
        ("bob", "127.0.0.1", "logout user=bob"),
    ]
    stored = " ".join(stack.table_values("audit_log"))  # every column, read with SQL
    for text in (WRONG, WRONG + "2", "bob-user-pass", "<img", "src=x"):
        assert text not in stored


def test_keys_made_and_revoked_on_account_are_audited(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        login(client, stack.url, "bob", "bob-user-pass")
        page = client.post(f"{stack.url}/account/keys",
                           data={"project": "research", "name": "<b>ci</b>",
                                 "csrf": csrf_of(client, stack.url)},
                           follow_redirects=True)  # POST, 303, then the GET shows the secret
        assert page.status_code == 200 and [r.status_code for r in page.history] == [303]
        secret = re.search(r"llmgw_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", page.text)
        assert secret
        key_id = secret.group(0).split("_")[1]
        revoked = client.post(f"{stack.url}/account/keys/{key_id}/revoke",
                              data={"csrf": csrf_of(client, stack.url)})
        assert revoked.status_code == 303
    made = [e for e in entries(stack) if e.action.startswith("key.")]
    assert [(e.actor, e.source, e.line()) for e in made] == [
        ("bob", "127.0.0.1", f"key.create key={key_id} project=research"),
        ("bob", "127.0.0.1", f"key.revoke key={key_id} project=research"),
    ]
    stored = " ".join(stack.table_values("audit_log"))
    assert secret.group(0) not in stored and "<b>ci" not in stored


def test_admin_shows_the_audit_log_escaped(stack: Stack) -> None:
    # An entry written around audits.record (which would have made it "?"): the page must
    # escape whatever text lands in the table.
    evil = '<img src=x onerror="alert(1)">'
    stack.run(stack.db.insert_audit(Entry(1_800_000_000.0, "ada", "10.0.0.9", "key.create",
                                          f"key={evil}")))
    with httpx.Client(timeout=30) as client:
        login(client, stack.url, "ada", "ada-admin-pass")
        page = client.get(f"{stack.url}/admin")
    assert page.status_code == 200
    section = page.text.split('id="audit-title"', 1)[1]
    assert evil not in page.text
    assert "key.create key=&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in section
    assert "10.0.0.9" in section and "login.ok user=ada method=password" in section


def legend(html: str, title: str) -> dict[str, int]:
    """The per-group totals a chart of /admin shows in its legend."""
    chart = html.split(f'aria-label="{title}"', 1)[1].split("</svg>", 1)[0]
    return {name: int(number.replace(",", "")) for name, number in
            re.findall(r'<text class="legend"[^>]*>([^<]+) \(([\d,]+)\)</text>', chart)}


def test_usage_export_agrees_with_the_admin_charts(stack: Stack) -> None:
    research, ops = stack.key("research"), stack.key("ops")
    for key, model, count in ((research, "chat", 5), (ops, "chat", 3), (ops, "coder", 2)):
        client = openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0)
        for i in range(count):
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "count " * (i + 1)}])
        with client.chat.completions.create(model=model, stream=True, messages=[
                {"role": "user", "content": "stream please"}]) as stream:
            for _ in stream:
                pass
    rows = stack.rows()
    assert len(rows) == 13
    with httpx.Client(timeout=30) as client:
        login(client, stack.url, "ada", "ada-admin-pass")
        html = client.get(f"{stack.url}/admin").text

    step, slots = admins.RANGES["24h"]
    now = max(r.ts for r in rows)
    since = (now // step) * step - (slots - 1) * step
    window = [dt.datetime.fromtimestamp(t, dt.UTC).isoformat()
              for t in (since, since + slots * step)]
    for by in ("project", "key", "model"):
        query = exports.parse(*window, by, "json", None)
        lines = stack.run(exports.export(stack.db, query))
        exported = {line.keys[by]: line for line in lines}
        assert legend(html, f"Requests per {by}, last 24h") == {
            name: line.requests for name, line in exported.items()}
        charted: dict[str, list[float]] = {}
        for bucket in stack.run(usages.series(stack.db, by, since, step)):
            sums = charted.setdefault(bucket.group, [0, 0, 0.0])
            sums[0] += bucket.requests
            sums[1] += bucket.tokens
            sums[2] += bucket.cost_usd
        assert set(charted) == set(exported)
        for name, (requests, tokens, cost) in charted.items():
            line = exported[name]
            assert (line.requests, line.prompt_tokens + line.completion_tokens) == (
                requests, tokens)
            assert line.cost_usd == pytest.approx(cost, rel=1e-9, abs=1e-12)
    by_project = {line.keys["project"]: line.requests for line in stack.run(exports.export(
        stack.db, exports.parse(*window, "project", "csv", None)))}
    assert by_project == {"research": 6, "ops": 7}
    assert sum(line.cost_usd for line in lines) > 0  # chat is priced: the sums mean something
